// Loop nest: the algorithm's pseudocode as the library lists it (pseudocode()), with the line of the
// current event and the loop indices (i, j) highlighted, and the event itself in words.
#include <imgui.h>

#include "app/panels.hpp"
#include "app/palette.hpp"
#include "model/pseudocode.hpp"

namespace flashlab::viz {

void draw_loop_nest(AppState& st) {
  if (!st.replay) return;
  const Trace& t = *st.trace;
  const TileEvent* e = st.replay->current();
  const int line = e ? e->line : 0;
  ImGui::Text("%s, %s pass", to_string(t.algorithm), t.pass == Pass::Forward ? "forward" : "backward");
  ImGui::SameLine();
  if (e && (e->i >= 0 || e->j >= 0)) {
    ImGui::TextColored(ImVec4(1.0f, 0.69f, 0.13f, 1.0f), "  i = %s   j = %s", e->i >= 0 ? std::to_string(e->i).c_str() : "-",
                       e->j >= 0 ? std::to_string(e->j).c_str() : "-");
  }
  ImGui::TextWrapped("%s", e ? describe(*e).c_str() : "step 0: nothing has moved yet");
  ImGui::Separator();
  ImGui::BeginChild("##code", ImVec2(0, 0), false);
  const auto& code = pseudocode(t.algorithm, t.pass);
  ImDrawList* dl = ImGui::GetWindowDrawList();
  dl->ChannelsSplit(2);  // text on top (1), the highlight behind it (0), sized by the wrapped text
  const float number_w = ImGui::CalcTextSize("00 ").x;
  for (int n = 1; n <= int(code.size()); ++n) {
    const bool here = n == line;
    dl->ChannelsSetCurrent(1);
    const ImVec2 top = ImGui::GetCursorScreenPos();
    ImGui::TextColored(here ? ImVec4(1.0f, 0.8f, 0.4f, 1.0f) : ImVec4(0.55f, 0.57f, 0.62f, 1.0f), "%2d", n);
    ImGui::SameLine(number_w);
    ImGui::PushTextWrapPos(0.0f);
    if (here) ImGui::TextColored(ImVec4(1.0f, 1.0f, 1.0f, 1.0f), "%s", code[std::size_t(n - 1)].c_str());
    else ImGui::TextUnformatted(code[std::size_t(n - 1)].c_str());
    ImGui::PopTextWrapPos();
    if (here) {
      dl->ChannelsSetCurrent(0);
      dl->AddRectFilled(ImVec2(top.x - 2, top.y - 1), ImVec2(top.x + ImGui::GetContentRegionAvail().x, ImGui::GetItemRectMax().y + 1),
                        IM_COL32(palette::kInSram.r, palette::kInSram.g, palette::kInSram.b, 80));
      if (ImGui::GetScrollMaxY() > 0) ImGui::SetScrollHereY(0.4f);
    }
  }
  dl->ChannelsMerge();
  ImGui::EndChild();
}

}  // namespace flashlab::viz
