#pragma once
// The app's one small plotting module (ImPlot is not packaged here): lines and markers on linear or
// log axes, a legend, the nearest point's values on hover, zoom with the mouse wheel, pan by dragging,
// double-click to reset. Drawn with ImGui's draw list.
#include <imgui.h>

#include <string>
#include <vector>

namespace flashlab::viz {

struct PlotSeries {
  std::string name;
  std::vector<double> x, y;
  ImU32 colour = 0xffffffff;
  bool line = true;     // false: markers only (measured points)
  bool markers = true;
  float thickness = 2.f;
};

struct PlotSpec {
  const char* id = "plot";
  std::string title, x_label, y_label;
  bool log_x = true, log_y = true;
  std::string (*format_x)(double) = nullptr;  // tick and hover labels; nullptr: %g
  std::string (*format_y)(double) = nullptr;
  bool integer_x = false;  // linear x ticks on whole numbers only (counts)
};

// Draws a plot filling `size` at the cursor. Non-positive values are left out on log axes.
void plot(const PlotSpec&, const std::vector<PlotSeries>&, ImVec2 size);

ImU32 to_imu32(unsigned char r, unsigned char g, unsigned char b, unsigned char a = 255);

}  // namespace flashlab::viz
