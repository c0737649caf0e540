#pragma once
// The registry of panels: one entry per panel, each drawn by one function in its own file
// (app/panels/*.cpp). Adding a panel means writing its function and adding one row in panels.cpp.
#include <vector>

#include "app_state.hpp"

namespace flashlab::viz {

struct Panel {
  const char* id;     // as in scenario files ("tiles")
  const char* title;  // window title
  bool sidebar;       // stacked in the left column (controls, transport, export)
  float sidebar_height;  // its height in the column; 0: what the others leave
  float weight;          // its share of a grid row's width, against the others in that row
  void (*draw)(AppState&);
};

const std::vector<Panel>& panels();

// Whether the panel with this id is shown.
bool panel_visible(const AppState&, const char* id);

// Lays the visible panels out over the whole window (sidebar left, the rest in a grid) and draws them;
// first, the transport's keys (handle_transport_keys), which work whichever panels are shown.
void draw_panels(AppState&);
void handle_transport_keys(AppState&);  // space, left/right (shift: 1%), home/end; not while a text field has focus

// The panel functions (one file each).
void draw_controls(AppState&);
void draw_transport(AppState&);
void draw_export(AppState&);
void draw_loop_nest(AppState&);
void draw_tiles(AppState&);
void draw_memory_chart(AppState&);
void draw_online_softmax(AppState&);
void draw_compare(AppState&);
void draw_plots(AppState&);
void draw_pipeline(AppState&);
void draw_ring(AppState&);
void draw_fp8(AppState&);

}  // namespace flashlab::viz
