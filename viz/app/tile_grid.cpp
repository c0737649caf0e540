#include "tile_grid.hpp"

#include <algorithm>
#include <string>

#include "probe.hpp"

namespace flashlab::viz {

namespace {

constexpr float kGap = 8.f;
constexpr float kMaxCell = 44.f;
constexpr float kHeatBarFraction = 0.28f;  // the bar keeps the tile's centre in its state colour
constexpr ImU32 kLabel = IM_COL32(220, 222, 230, 255);

// Heat: dark violet (read once) to pink to near white (read most).
ImU32 heat_colour(float t) {
  t = std::clamp(t, 0.f, 1.f);
  const float r = 90 + 165 * std::min(1.f, t * 1.6f), g = 40 + 200 * std::max(0.f, t - 0.55f) / 0.45f,
              b = 160 + 80 * t;
  return IM_COL32(int(r), int(g), int(std::min(255.f, b)), 255);
}

// A group of tiles shows the most telling state: in SRAM, else pending, else done, else skipped.
TileState merge(TileState a, TileState b) {
  auto rank = [](TileState s) {
    switch (s) {
      case TileState::InSram: return 3;
      case TileState::Pending: return 2;
      case TileState::Done: return 1;
      default: return 0;
    }
  };
  return rank(a) >= rank(b) ? a : b;
}

struct Cell {
  ImVec2 a, b;
};

void draw_heat_bar(ImDrawList* dl, ImVec2 a, ImVec2 b, int reads, int max_reads) {
  const float w = b.x - a.x;
  {
    // Read once is the floor (dark); the most-read tile is the hottest.
    const ImVec2 ha(a.x, b.y - (b.y - a.y) * kHeatBarFraction);
    dl->AddRectFilled(ha, b, heat_colour(max_reads > 1 ? float(reads - 1) / float(max_reads - 1) : 0.f));
    if (w >= 30 && reads > 1) {
      const std::string n = std::to_string(reads);
      dl->AddText(nullptr, 0.f, ImVec2(b.x - ImGui::CalcTextSize(n.c_str()).x - 2, ha.y - 1), IM_COL32(20, 20, 20, 255),
                  n.c_str());
    }
  }
}

// Cells of 6 px and more get a 1 px gap so tiles read as tiles.
float inset_of(float w) { return w >= 6 ? 1.f : 0.f; }

void draw_cell(ImDrawList* dl, Cell c, TileState s, int reads, int max_reads, bool heat) {
  const float inset = inset_of(std::min(c.b.x - c.a.x, c.b.y - c.a.y));
  const ImVec2 a(c.a.x + inset, c.a.y + inset), b(c.b.x - inset, c.b.y - inset);
  dl->AddRectFilled(a, b, state_colour(s));
  if (heat && reads > 0 && max_reads > 0) draw_heat_bar(dl, a, b, reads, max_reads);
}

}  // namespace

ImU32 rgb(const palette::Rgb& c, unsigned char alpha) { return IM_COL32(c.r, c.g, c.b, alpha); }

ImU32 state_colour(TileState s) {
  switch (s) {
    case TileState::Pending: return rgb(palette::kPending);
    case TileState::InSram: return rgb(palette::kInSram);
    case TileState::Done: return rgb(palette::kDone);
    case TileState::Skipped: return rgb(palette::kSkipped);
  }
  return 0;
}

void tile_legend(bool heat) {
  const TileState states[] = {TileState::Pending, TileState::InSram, TileState::Done, TileState::Skipped};
  const char* names[] = {"pending", "in SRAM", "done", "skipped (causal)"};
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const float h = ImGui::GetTextLineHeight();
  for (int k = 0; k < 4; ++k) {
    const ImVec2 p = ImGui::GetCursorScreenPos();
    dl->AddRectFilled(p, ImVec2(p.x + h, p.y + h), state_colour(states[k]));
    dl->AddRect(p, ImVec2(p.x + h, p.y + h), IM_COL32(120, 120, 130, 255));
    ImGui::Dummy(ImVec2(h, h));
    ImGui::SameLine();
    ImGui::TextUnformatted(names[k]);
    ImGui::SameLine(0, 14);
  }
  if (heat) {
    const ImVec2 p = ImGui::GetCursorScreenPos();
    for (int k = 0; k < 24; ++k)
      dl->AddRectFilled(ImVec2(p.x + float(k) * 2.5f, p.y + h * 0.35f), ImVec2(p.x + float(k + 1) * 2.5f, p.y + h),
                        heat_colour(float(k) / 23.f));
    ImGui::Dummy(ImVec2(60, h));
    ImGui::SameLine();
    ImGui::TextUnformatted("times read from HBM (bar)");
  } else {
    ImGui::NewLine();
  }
}

void draw_tile_picture(ImDrawList* dl, const Replay& r, ImVec2 p0, ImVec2 size, bool heat, const char* probe_prefix) {
  const Trace& t = r.trace();
  const int gr = (t.Tr + kMaxCellsPerSide - 1) / kMaxCellsPerSide, gc = (t.Tc + kMaxCellsPerSide - 1) / kMaxCellsPerSide;
  const int R = (t.Tr + gr - 1) / gr, C = (t.Tc + gc - 1) / gc;
  const float label_w = ImGui::CalcTextSize("V").x + 6, label_h = ImGui::GetTextLineHeight() + 2;
  const float cw = (size.x - label_w - 2 * kGap) / float(C + 2), ch = (size.y - label_h - 2 * kGap) / float(R + 2);
  // Strips are T thick; grid cells are csx by csy: square when both are large enough to read as
  // tiles, else stretched to use the whole panel (a 128 x 72 grid at N = 16k).
  constexpr float kMinStrip = 10.f;  // thin strips would hide the Q, K, V, O states
  const float T = std::clamp(std::min(cw, ch), kMinStrip, kMaxCell);
  float csx = std::max(1.f, std::min(kMaxCell, (size.x - label_w - 2 * kGap - 2 * T) / float(C)));
  float csy = std::max(1.f, std::min(kMaxCell, (size.y - label_h - 2 * kGap - 2 * T) / float(R)));
  if (std::min(csx, csy) >= 12) csx = csy = std::min(csx, csy);
  const bool exact = gr == 1 && gc == 1;
  const bool record = probe_prefix && exact;
  const std::string pre = probe_prefix ? probe_prefix : "";

  const float qx = p0.x + label_w;                 // Q strip
  const float gx = qx + T + kGap;                  // score grid
  const float ox = gx + csx * float(C) + kGap;     // O strip
  const float ky = p0.y + label_h;                 // K strip
  const float vy = ky + T;                         // V strip
  const float gy = vy + T + kGap;                  // score grid

  int max_reads = 1;
  for (TensorId id : {TensorId::Q, TensorId::O})
    for (int b = 0; b < t.Tr; ++b) max_reads = std::max(max_reads, r.reads(id, b));
  for (TensorId id : {TensorId::K, TensorId::V})
    for (int b = 0; b < t.Tc; ++b) max_reads = std::max(max_reads, r.reads(id, b));

  auto strip = [&](TensorId id, bool vertical, ImVec2 origin, int groups, int g, int blocks) {
    for (int c = 0; c < groups; ++c) {
      TileState s = TileState::Skipped;
      int reads = 0;
      for (int b = c * g; b < std::min(blocks, (c + 1) * g); ++b) {
        s = merge(s, r.tile(id, b));
        reads = std::max(reads, r.reads(id, b));
      }
      const ImVec2 a = vertical ? ImVec2(origin.x, origin.y + csy * float(c)) : ImVec2(origin.x + csx * float(c), origin.y);
      const Cell cell{a, vertical ? ImVec2(a.x + T, a.y + csy) : ImVec2(a.x + csx, a.y + T)};
      draw_cell(dl, cell, s, reads, max_reads, heat);
      if (record) probe::tile(pre + to_string(id) + "/" + std::to_string(c), cell.a.x, cell.a.y, cell.b.x, cell.b.y, s);
    }
  };
  strip(TensorId::K, false, ImVec2(gx, ky), C, gc, t.Tc);
  strip(TensorId::V, false, ImVec2(gx, vy), C, gc, t.Tc);
  strip(TensorId::Q, true, ImVec2(qx, gy), R, gr, t.Tr);
  strip(TensorId::O, true, ImVec2(ox, gy), R, gr, t.Tr);

  int max_loads = 1;
  for (int i = 0; i < t.Tr; ++i)
    for (int j = 0; j < t.Tc; ++j) max_loads = std::max(max_loads, r.score_loads(i, j));
  // The score grid. Small grids: one rectangle per tile. Large ones (grouped or tiny cells): runs of
  // equal state merge into one rectangle per row, which keeps a software renderer's frame short at
  // N = 16k (a few hundred triangles instead of thousands).
  const bool merge_runs = !exact || std::min(csx, csy) < 6;
  for (int ci = 0; ci < R; ++ci) {
    int run_start = 0;
    TileState run_state = TileState::Skipped;
    auto flush = [&](int run_end) {
      if (run_end > run_start)
        dl->AddRectFilled(ImVec2(gx + csx * float(run_start), gy + csy * float(ci)),
                          ImVec2(gx + csx * float(run_end), gy + csy * float(ci + 1)), state_colour(run_state));
    };
    for (int cj = 0; cj < C; ++cj) {
      TileState s = TileState::Skipped;
      int loads = 0;
      for (int i = ci * gr; i < std::min(t.Tr, (ci + 1) * gr); ++i)
        for (int j = cj * gc; j < std::min(t.Tc, (cj + 1) * gc); ++j) {
          s = merge(s, r.score(i, j));
          loads = std::max(loads, r.score_loads(i, j));
        }
      const ImVec2 a(gx + csx * float(cj), gy + csy * float(ci));
      const Cell cell{a, ImVec2(a.x + csx, a.y + csy)};
      if (!merge_runs) {
        draw_cell(dl, cell, s, loads, max_loads, heat);
      } else {
        if (cj == 0 || s != run_state) {
          flush(cj);
          run_start = cj;
          run_state = s;
        }
        if (heat && loads > 0) draw_heat_bar(dl, cell.a, cell.b, loads, max_loads);
      }
      if (record)
        probe::tile(pre + "score/" + std::to_string(ci) + "," + std::to_string(cj), cell.a.x, cell.a.y, cell.b.x,
                    cell.b.y, s);
    }
    if (merge_runs) flush(C);
  }

  // Labels and the current (i, j): an outline and ticks.
  dl->AddText(ImVec2(qx + T / 2 - 4, gy - label_h), kLabel, "Q");
  dl->AddText(ImVec2(ox + T / 2 - 4, gy - label_h), kLabel, "O");
  dl->AddText(ImVec2(p0.x, ky + T / 2 - label_h / 2), kLabel, "K");
  dl->AddText(ImVec2(p0.x, vy + T / 2 - label_h / 2), kLabel, "V");
  dl->AddText(ImVec2(gx, p0.y), kLabel, exact ? "S = Q K^T  (Tr x Tc tiles)" : "S = Q K^T  (cells group tiles)");
  if (const TileEvent* e = r.current()) {
    int i, j;
    if (score_tile_of(*e, i, j)) {
      const float x = gx + csx * (float(j / gc) + 0.5f), y = gy + csy * (float(i / gr) + 0.5f);
      // Ticks in the gaps point at row i and column j without covering other tiles.
      const ImU32 hair = IM_COL32(255, 255, 255, 200);
      dl->AddLine(ImVec2(qx + T + 1, y), ImVec2(gx - 1, y), hair, 2.f);
      dl->AddLine(ImVec2(x, vy + T + 1), ImVec2(x, gy - 1), hair, 2.f);
      dl->AddRect(ImVec2(x - csx / 2, y - csy / 2), ImVec2(x + csx / 2, y + csy / 2), IM_COL32(255, 255, 255, 255), 0, 0, 2.f);
    }
  }
}

}  // namespace flashlab::viz
