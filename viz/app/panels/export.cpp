// Export: a PNG of the whole window (libpng, saved by main after the frame is drawn), the
// counters at the current step and the sweeps as CSV, and the scenario as JSON to replay it later.
#include <imgui.h>

#include "app/panels.hpp"
#include "logic/csv.hpp"

namespace flashlab::viz {

void draw_export(AppState& st) {
  static char stem[256] = "flashlab";
  ImGui::SetNextItemWidth(-1);
  ImGui::InputText("##stem", stem, sizeof stem);
  const std::string base = stem;
  if (ImGui::Button("PNG")) {
    st.screenshot_request = base + ".png";
    st.status = "saving " + st.screenshot_request;
  }
  ImGui::SameLine();
  try {
    if (ImGui::Button("counters CSV") && st.replay) {
      write_text_file(base + "-counters.csv", counters_csv(*st.replay));
      st.status = "wrote " + base + "-counters.csv";
    }
    ImGui::SameLine();
    if (ImGui::Button("sweeps CSV")) {
      std::lock_guard a(st.sweep_job.mutex);
      std::lock_guard b(st.timing_job.mutex);
      write_text_file(base + "-sweeps.csv", sweep_csv(st.sweep, st.timing));
      st.status = "wrote " + base + "-sweeps.csv";
    }
    ImGui::SameLine();
    if (ImGui::Button("scenario")) {
      Scenario s = st.scenario;
      if (st.replay) s.step = st.replay->step();
      write_text_file(base + ".json", to_json(s));
      st.status = "wrote " + base + ".json";
    }
  } catch (const InputError& e) {
    st.status = e.what();
  }
  ImGui::TextWrapped("%s", st.status.c_str());
}

}  // namespace flashlab::viz
