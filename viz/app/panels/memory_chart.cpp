// Memory chart, after Nsight Compute's: an HBM box and an SRAM box, one link per tensor labelled
// with the bytes it moved so far (reads to the right, writes to the left, thickness by share), the
// transfer in flight animated along its link, and SRAM occupancy against M (red when over).
// Below: the time those bytes take at the measured 3.0 TB/s, and what the traffic model's GPU level says
// DRAM would move for this problem on the scenario's GPU (the CUDA kernel of its algorithm, through the L2
// model: model/gpu.hpp), which is what Nsight Compute's counters measure.
#include <imgui.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "app/panels.hpp"
#include "app/tile_grid.hpp"
#include "logic/format.hpp"

namespace flashlab::viz {

namespace {
constexpr ImU32 kBox = IM_COL32(44, 48, 58, 255);
constexpr ImU32 kBoxEdge = IM_COL32(130, 136, 150, 255);
constexpr ImU32 kText = IM_COL32(225, 227, 235, 255);
constexpr ImU32 kRead = IM_COL32(90, 160, 240, 255);
constexpr ImU32 kWrite = IM_COL32(230, 97, 80, 255);
constexpr ImU32 kIdle = IM_COL32(80, 84, 96, 255);

void arrow(ImDrawList* dl, ImVec2 a, ImVec2 b, ImU32 c, float thick) {
  dl->AddLine(a, b, c, thick);
  const float dir = b.x > a.x ? 1.f : -1.f, head = 5.f + thick;
  dl->AddTriangleFilled(ImVec2(b.x, b.y), ImVec2(b.x - dir * head, b.y - head * 0.6f), ImVec2(b.x - dir * head, b.y + head * 0.6f), c);
}
}  // namespace

void draw_memory_chart(AppState& st) {
  if (!st.replay) return;
  const Replay& r = *st.replay;
  const Trace& t = *st.trace;
  const TrafficTotals& now = r.totals();
  const GpuPreset& gpu = h100();
  ImGui::Text("moved so far: %s read, %s written  (whole run: %s)", format_bytes(double(now.total_read())).c_str(),
              format_bytes(double(now.total_written())).c_str(), format_bytes(double(t.totals.total())).c_str());

  std::vector<int> tensors;
  double max_bytes = 1;
  for (int k = 0; k < static_cast<int>(TensorId::Count); ++k)
    if (t.totals.read[k] + t.totals.written[k] > 0) {
      tensors.push_back(k);
      max_bytes = std::max(max_bytes, double(std::max(t.totals.read[k], t.totals.written[k])));
    }

  ImDrawList* dl = ImGui::GetWindowDrawList();
  const ImVec2 p0 = ImGui::GetCursorScreenPos();
  const ImVec2 avail = ImGui::GetContentRegionAvail();
  const float footer = ImGui::GetTextLineHeightWithSpacing() * 6 + 26;
  const float h = std::max(80.f, avail.y - footer);
  const float box_w = std::max(90.f, avail.x * 0.22f);
  const ImVec2 hbm0 = p0, hbm1(p0.x + box_w, p0.y + h);
  const ImVec2 sram0(p0.x + avail.x - box_w, p0.y), sram1(p0.x + avail.x, p0.y + h);
  dl->AddRectFilled(hbm0, hbm1, kBox, 4);
  dl->AddRect(hbm0, hbm1, kBoxEdge, 4);
  dl->AddRectFilled(sram0, sram1, kBox, 4);
  dl->AddRect(sram0, sram1, kBoxEdge, 4);
  const float lh = ImGui::GetTextLineHeight();
  dl->AddText(ImVec2(hbm0.x + 6, hbm0.y + 4), kText, "HBM");
  dl->AddText(ImVec2(hbm0.x + 6, hbm0.y + 4 + lh), IM_COL32(160, 165, 175, 255), "3.0 TB/s");
  dl->AddText(ImVec2(hbm0.x + 6, hbm0.y + 4 + 3 * lh), IM_COL32(160, 165, 175, 255), "footprint");
  dl->AddText(ImVec2(hbm0.x + 6, hbm0.y + 4 + 4 * lh), kText, format_bytes(double(st.trace_footprint_bytes)).c_str());
  dl->AddText(ImVec2(sram0.x + 6, sram0.y + 4), kText, "SRAM");
  dl->AddText(ImVec2(sram0.x + 6, sram0.y + 4 + lh), IM_COL32(160, 165, 175, 255),
              ("M = " + format_bytes(double(t.sram_capacity))).c_str());

  // Resident tiles, listed inside the SRAM box.
  std::string resident;
  for (TensorId id : {TensorId::Q, TensorId::K, TensorId::V, TensorId::O, TensorId::dO, TensorId::dQ, TensorId::dK, TensorId::dV}) {
    const int len = r.axis_length(axis_of(id));
    for (int b = 0; b < len && resident.size() < 200; ++b)
      if (r.tile(id, b) == TileState::InSram) resident += std::string(to_string(id)) + "_" + std::to_string(b) + " ";
  }
  if (const TileEvent* e = r.current(); e && e->i >= 0 && e->j >= 0) resident += "S_" + std::to_string(e->i) + "," + std::to_string(e->j);
  dl->PushClipRect(sram0, sram1, true);
  ImGui::SetCursorScreenPos(ImVec2(sram0.x + 6, sram0.y + 8 + 2 * lh));
  ImGui::PushTextWrapPos(sram1.x - ImGui::GetWindowPos().x - 4);  // wrap positions are window-local
  ImGui::TextColored(ImVec4(1.0f, 0.69f, 0.13f, 1.0f), "%s", resident.c_str());
  ImGui::PopTextWrapPos();
  dl->PopClipRect();

  // Links: one row per tensor; reads above (HBM -> SRAM), writes below (SRAM -> HBM).
  const TileEvent* cur = r.current();
  // Row heights: two lines (label + arrow) per direction the tensor moves in.
  float need = 0;
  for (int k : tensors) need += float((t.totals.read[k] > 0) + (t.totals.written[k] > 0));
  const float line_h = std::min(28.f, std::max(lh + 4, (h - 2 * lh - 8) / std::max(1.f, need)));
  const float lx0 = hbm1.x + 8, lx1 = sram0.x - 8;
  float y = p0.y + 2 * lh + 8;
  for (int k : tensors) {
    const double rd = double(now.read[k]), wr = double(now.written[k]);
    const bool live = cur && static_cast<int>(cur->tensor) == k &&
                      (cur->direction == Direction::Load || cur->direction == Direction::Store);
    const std::string name = to_string(static_cast<TensorId>(k));
    if (t.totals.read[k] > 0) {
      y += line_h;
      const bool on = live && cur->direction == Direction::Load;
      arrow(dl, ImVec2(lx0, y - 3), ImVec2(lx1, y - 3), rd > 0 ? kRead : kIdle, 1.f + 4.f * float(rd / max_bytes));
      dl->AddText(ImVec2(lx0 + 4, y - 5 - lh), kText, (name + " read " + format_bytes(rd)).c_str());
      if (on) dl->AddCircleFilled(ImVec2(lx0 + (lx1 - lx0) * float(st.playing ? st.phase : 0.5), y - 3), 6.f, rgb(palette::kInSram));
    }
    if (t.totals.written[k] > 0) {
      y += line_h;
      const bool on = live && cur->direction == Direction::Store;
      arrow(dl, ImVec2(lx1, y - 3), ImVec2(lx0, y - 3), wr > 0 ? kWrite : kIdle, 1.f + 4.f * float(wr / max_bytes));
      const std::string label = name + " written " + format_bytes(wr);
      dl->AddText(ImVec2(lx1 - ImGui::CalcTextSize(label.c_str()).x - 4, y - 5 - lh), kText, label.c_str());
      if (on) dl->AddCircleFilled(ImVec2(lx1 - (lx1 - lx0) * float(st.playing ? st.phase : 0.5), y - 3), 6.f, rgb(palette::kInSram));
    }
  }

  // SRAM occupancy against M.
  ImGui::SetCursorScreenPos(ImVec2(p0.x, p0.y + h + 6));
  const std::int64_t used = r.sram_bytes();
  const bool over = used > t.sram_capacity || t.totals.peak_sram_bytes > t.sram_capacity;
  const ImVec2 b0 = ImGui::GetCursorScreenPos();
  const float bw = avail.x, bh = 16;
  dl->AddRectFilled(b0, ImVec2(b0.x + bw, b0.y + bh), IM_COL32(35, 37, 44, 255));
  const float frac = float(std::min(1.0, double(used) / double(std::max<std::int64_t>(1, t.sram_capacity))));
  dl->AddRectFilled(b0, ImVec2(b0.x + bw * frac, b0.y + bh), over ? rgb(palette::kOver) : rgb(palette::kDone));
  const float peak = float(std::min(1.0, double(now.peak_sram_bytes) / double(std::max<std::int64_t>(1, t.sram_capacity))));
  dl->AddLine(ImVec2(b0.x + bw * peak, b0.y - 2), ImVec2(b0.x + bw * peak, b0.y + bh + 2), IM_COL32(255, 255, 255, 200), 2.f);
  const std::string occ = "SRAM " + format_bytes(double(used)) + " of M = " + format_bytes(double(t.sram_capacity)) +
                          "  (peak " + format_bytes(double(now.peak_sram_bytes)) + ")";
  dl->AddText(ImVec2(b0.x + 6, b0.y + 1), kText, occ.c_str());
  ImGui::Dummy(ImVec2(bw, bh + 2));
  if (t.totals.peak_sram_bytes > t.sram_capacity)
    ImGui::TextColored(ImVec4(1.0f, 0.42f, 0.38f, 1.0f), "over M: this tiling needs %s of SRAM at its peak",
                       format_bytes(double(t.totals.peak_sram_bytes)).c_str());

  const double secs = double(now.total()) / gpu.hbm_bytes_per_s;
  ImGui::Text("at %.1f TB/s these bytes take %s (whole run %s)", gpu.hbm_bytes_per_s / 1e12, format_seconds(secs).c_str(),
              format_seconds(double(t.totals.total()) / gpu.hbm_bytes_per_s).c_str());
  std::string note;
  {
    std::lock_guard lock(st.note_job.mutex);
    note = st.gpu_note;
  }
  if (note.empty() && st.note_job.running()) note = "modeling this problem's kernel on the " + st.scenario.gpu + "'s L2 ...";
  ImGui::TextWrapped("L2 model: %s", note.c_str());
}

}  // namespace flashlab::viz
