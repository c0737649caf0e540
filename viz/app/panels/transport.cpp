// Transport: play / pause, step forward and back, jump to either end, speed, and a scrubber over the
// event stream. Keys (when no text field has focus), whether or not this panel is shown (the lessons'
// scenarios hide it and tell the student to step with the arrows): space plays or pauses, left/right step
// one event (with shift: one percent), home/end jump. With the Ring panel shown, two more buttons step
// the ring (its steps are laid over the same stream).
#include <imgui.h>

#include <algorithm>
#include <cmath>

#include "app/panels.hpp"
#include "logic/format.hpp"
#include "logic/ring_view.hpp"

namespace flashlab::viz {

namespace {
constexpr double kMinSpeed = 1, kMaxSpeed = 1e6;  // events per second
}

void handle_transport_keys(AppState& st) {
  if (!st.replay) return;
  const std::int64_t n = st.replay->size(), k = st.replay->step();
  const std::int64_t big = std::max<std::int64_t>(1, n / 100);
  const ImGuiIO& io = ImGui::GetIO();
  if (!io.WantTextInput) {
    if (ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_Space))) {
      if (!st.playing && k >= n) seek(st, 0);
      st.playing = !st.playing;
    }
    if (ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_RightArrow))) seek(st, k + (io.KeyShift ? big : 1));
    if (ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_LeftArrow))) seek(st, k - (io.KeyShift ? big : 1));
    if (ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_Home))) seek(st, 0);
    if (ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_End))) seek(st, n);
  }
}

void draw_transport(AppState& st) {
  if (!st.replay) return;
  const std::int64_t n = st.replay->size();
  if (ImGui::Button("|<")) seek(st, 0);
  ImGui::SameLine();
  if (ImGui::Button("<")) seek(st, st.replay->step() - 1);
  ImGui::SameLine();
  if (ImGui::Button(st.playing ? "pause" : "play", ImVec2(60, 0))) {
    if (!st.playing && st.replay->step() >= n) seek(st, 0);
    st.playing = !st.playing;
  }
  ImGui::SameLine();
  if (ImGui::Button(">")) seek(st, st.replay->step() + 1);
  ImGui::SameLine();
  if (ImGui::Button(">|")) seek(st, n);
  ImGui::SameLine();
  ImGui::TextDisabled("space, arrows");

  long long step = st.replay->step();
  const long long lo = 0, hi = n;
  ImGui::SetNextItemWidth(-1);
  if (ImGui::SliderScalar("##step", ImGuiDataType_S64, &step, &lo, &hi, "step %lld")) seek(st, step);
  float speed = float(st.speed);
  ImGui::SetNextItemWidth(-80);
  if (ImGui::SliderFloat("events/s", &speed, float(kMinSpeed), float(kMaxSpeed), "%.0f", ImGuiSliderFlags_Logarithmic))
    st.speed = speed;
  ImGui::Text("event %s of %s", format_count(double(st.replay->step())).c_str(), format_count(double(n)).c_str());
  if (panel_visible(st, "ring")) {  // the Ring panel lays its P steps over the same stream
    const int ranks = st.scenario.ring.ranks;
    const RingPosition at = ring_position(st.replay->step(), n, ranks);
    ImGui::SameLine();
    ImGui::TextUnformatted("  ring step");
    ImGui::SameLine();
    if (ImGui::SmallButton("<##ring")) seek(st, event_of_ring_step(at.step - (at.progress > 0 ? 0 : 1), n, ranks));
    ImGui::SameLine();
    ImGui::Text("s%d of s0-s%d", at.step, ranks - 1);
    ImGui::SameLine();
    if (ImGui::SmallButton(">##ring")) seek(st, at.step + 1 < ranks ? event_of_ring_step(at.step + 1, n, ranks) : n);
  }
}

}  // namespace flashlab::viz
