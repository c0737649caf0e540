#include "state_dump.hpp"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <system_error>

#include "core/problem.hpp"
#include "panels.hpp"
#include "probe.hpp"

namespace flashlab::viz {

namespace {

std::string quoted(const std::string& s) { return nlohmann::json(s).dump(); }

std::string number(float v) {  // pixels: one decimal is more than a click needs
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", double(v));
  return buf;
}

}  // namespace

std::string state_json(const AppState& st, const WindowState& w) {
  const Scenario& s = st.scenario;
  std::string panels_shown;
  const auto& reg = panels();
  for (std::size_t k = 0; k < reg.size(); ++k)
    if (k < st.visible.size() && st.visible[k]) {
      if (!panels_shown.empty()) panels_shown += ", ";
      panels_shown += quoted(reg[k].id);
    }
  std::string out = "{\n";
  const auto line = [&out](const char* key, const std::string& value) {
    out += " \"";
    out += key;
    out += "\": ";
    out += value;
    out += ",\n";
  };
  line("step", std::to_string(st.replay ? st.replay->step() : 0));
  line("events", std::to_string(st.replay ? st.replay->size() : 0));
  line("algorithm", quoted(to_string(s.algorithm)));
  line("pass", quoted(s.pass == Pass::Forward ? "forward" : "backward"));
  line("N", std::to_string(s.seq_q));
  line("d", std::to_string(s.head_dim));
  line("sram_bytes", std::to_string(s.sram_bytes));
  line("causal", quoted(to_string(s.causal)));
  line("dtype", quoted(to_string(s.dtype)));
  line("compare", s.compare ? quoted(to_string(*s.compare)) : "null");
  line("panels", "[" + panels_shown + "]");
  line("playing", st.playing ? "true" : "false");
  char size[48];
  std::snprintf(size, sizeof size, "[%d, %d]", w.width, w.height);
  line("window", size);
  line("focused", w.focused ? "true" : "false");
  line("text_input", w.text_input ? "true" : "false");
  line("error", quoted(st.error));
  line("screenshots", std::to_string(st.screenshots_saved));
  line("last_screenshot", quoted(st.last_screenshot));
  line("status", quoted(st.status));
  out += " \"widgets\": {";
  bool first = true;
  for (const auto& [name, r] : probe::widgets()) {
    out += first ? "\n  " : ",\n  ";
    out += quoted(name);
    out += ": [";
    out += number(r.x0) + ", " + number(r.y0) + ", " + number(r.x1) + ", " + number(r.y1);
    out += "]";
    first = false;
  }
  out += first ? "}\n}\n" : "\n }\n}\n";
  return out;
}

void write_file_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw InputError("cannot write '" + tmp + "'");
    out << text;
    out.close();
    if (!out) throw InputError("writing '" + tmp + "' failed");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw InputError("cannot rename '" + tmp + "' to '" + path + "': " + ec.message());
}

}  // namespace flashlab::viz
