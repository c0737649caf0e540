// Controls: the scenario (algorithm, pass, N, d, SRAM size M, Br/Bc, causal alignment, dtype, the CUDA
// kernel and GPU of the GPU level), the GPU
// preset's measured figures, which panels are shown, and loading a scenario file. Every change goes
// through apply_scenario, so an impossible value shows the library's one-sentence error in red and
// the previous picture stays.
#include <imgui.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "app/panels.hpp"
#include "app/probe.hpp"
#include "logic/format.hpp"
#include "model/gpu.hpp"
#include "registry/gpu_models.hpp"

namespace flashlab::viz {

namespace {

const ImVec4 kErrorColour(1.0f, 0.42f, 0.38f, 1.0f);

// ImGui::Combo, with the box's rectangle (less its label, which does not open it) and, while its list is open,
// each entry's recorded for --state-file ("controls/algorithm", "controls/algorithm/fa1"), so that a test can
// click them where they are.
bool combo(const char* label, int& index, const char* const* items, int count) {
  const std::string name = std::string("controls/") + label;
  const ImVec2 at = ImGui::GetCursorScreenPos();
  const float width = ImGui::CalcItemWidth(), height = ImGui::GetFrameHeight();
  probe::widget(name, {at.x, at.y, at.x + width, at.y + height});
  if (!ImGui::BeginCombo(label, index >= 0 && index < count ? items[index] : "")) return false;
  // The list's first frame is laid out unseen (ImGui sizes it first): its entries are recorded from the second.
  const bool shown = !ImGui::IsWindowAppearing();
  bool changed = false;
  for (int k = 0; k < count; ++k) {
    if (ImGui::Selectable(items[k], k == index) && k != index) index = k, changed = true;
    if (shown) probe::widget(name + "/" + items[k]);
    if (k == index) ImGui::SetItemDefaultFocus();
  }
  ImGui::EndCombo();
  return changed;
}

}  // namespace

void draw_controls(AppState& st) {
  Scenario s = st.edit;
  bool changed = false;
  if (!st.scenario.caption.empty()) {
    ImGui::PushTextWrapPos();
    ImGui::TextColored(ImVec4(1.0f, 0.85f, 0.45f, 1.0f), "%s", st.scenario.caption.c_str());
    ImGui::PopTextWrapPos();
    ImGui::Separator();
  }
  ImGui::PushItemWidth(150);
  const char* algs[] = {"standard", "fa1", "fa2"};
  int a = static_cast<int>(s.algorithm);
  if (combo("algorithm", a, algs, 3)) s.algorithm = static_cast<Algorithm>(a), changed = true;
  const char* passes[] = {"forward", "backward"};
  int p = s.pass == Pass::Forward ? 0 : 1;
  if (combo("pass", p, passes, 2)) s.pass = p == 0 ? Pass::Forward : Pass::Backward, changed = true;
  int n = s.seq_q;
  if (ImGui::InputInt("N (seq)", &n, 64, 1024, ImGuiInputTextFlags_EnterReturnsTrue)) s.seq_q = s.seq_k = n, changed = true;
  int d = s.head_dim;
  if (ImGui::InputInt("d (head dim)", &d, 16, 64, ImGuiInputTextFlags_EnterReturnsTrue)) s.head_dim = d, changed = true;
  int kib = int(s.sram_bytes / 1024);
  if (ImGui::InputInt("M (SRAM KiB)", &kib, 16, 64, ImGuiInputTextFlags_EnterReturnsTrue))
    s.sram_bytes = std::int64_t(kib) * 1024, changed = true;
  int br = s.br, bc = s.bc;
  if (ImGui::InputInt("Br (0: from M)", &br, 8, 32, ImGuiInputTextFlags_EnterReturnsTrue)) s.br = br, changed = true;
  if (ImGui::InputInt("Bc (0: from M)", &bc, 8, 32, ImGuiInputTextFlags_EnterReturnsTrue)) s.bc = bc, changed = true;
  const char* causal[] = {"none", "top-left", "bottom-right"};
  int c = static_cast<int>(s.causal);
  if (combo("causal", c, causal, 3)) s.causal = static_cast<CausalAlign>(c), changed = true;
  const char* dtypes[] = {"f64", "f32", "f16", "bf16"};
  int t = static_cast<int>(s.dtype);
  if (combo("dtype", t, dtypes, 4)) s.dtype = static_cast<DType>(t), changed = true;
  // The GPU level (Plots panel, memory chart): which CUDA variant's kernels, on which GPU.
  std::vector<std::string> modeled = gpu_modeled_variants();
  modeled.insert(modeled.begin(), "");  // the algorithm's own kernel
  int gv = int(std::find(modeled.begin(), modeled.end(), s.gpu_variant) - modeled.begin());
  std::vector<const char*> modeled_names = {"(the algorithm's)"};
  for (std::size_t k = 1; k < modeled.size(); ++k) modeled_names.push_back(modeled[k].c_str());
  if (combo("GPU kernel", gv, modeled_names.data(), int(modeled_names.size()))) s.gpu_variant = modeled[std::size_t(gv)], changed = true;
  std::vector<const char*> gpu_ids;
  int gi = 0;
  for (const GpuSpec& g : gpu_specs()) {
    if (g.id == s.gpu) gi = int(gpu_ids.size());
    gpu_ids.push_back(g.id.data());  // the table's ids are string literals: null-terminated
  }
  if (combo("GPU", gi, gpu_ids.data(), int(gpu_ids.size()))) s.gpu = gpu_ids[std::size_t(gi)], changed = true;
  const char* cmp[] = {"(none)", "standard", "fa1", "fa2"};
  int ci = s.compare ? static_cast<int>(*s.compare) + 1 : 0;
  if (combo("compare with", ci, cmp, 4)) {
    if (ci == 0) s.compare.reset();
    else s.compare = static_cast<Algorithm>(ci - 1);
    changed = true;
  }
  ImGui::PopItemWidth();
  if (changed) {
    s.step = -1;
    apply_scenario(st, s);
  }
  if (!st.error.empty()) {
    ImGui::PushTextWrapPos();
    ImGui::TextColored(kErrorColour, "%s", st.error.c_str());
    ImGui::PopTextWrapPos();
    if (ImGui::SmallButton("back to the shown scenario")) {
      st.edit = st.scenario;
      st.error.clear();
    }
  }
  if (st.trace) {
    const Trace& tr = *st.trace;
    ImGui::Text("Br = %d, Bc = %d  ->  Tr = %d, Tc = %d", tr.tiling.Br, tr.tiling.Bc, tr.Tr, tr.Tc);
    ImGui::Text("%s events, %d bytes/element", format_count(double(tr.events.size())).c_str(), tr.bytes_per_element);
  }

  ImGui::Separator();
  const GpuPreset& g = h100();
  ImGui::TextUnformatted("GPU preset (measured on the lent H100, 2026-11-22):");
  ImGui::TextWrapped("%s: %.1f TB/s copy, %.0f-%.0f TFLOP/s bf16, %s L2, %s smem/SM, %d SMs", g.gpu.device_name.data(),
                     g.hbm_bytes_per_s / 1e12, g.bf16_flops_per_s / 1e12, g.bf16_flops_per_s_best / 1e12,
                     format_bytes(double(g.gpu.l2_bytes)).c_str(), format_bytes(double(g.smem_bytes_per_sm)).c_str(),
                     g.gpu.sms);
  if (ImGui::SmallButton("M = one SM's shared memory")) {
    Scenario h = st.scenario;
    h.sram_bytes = g.smem_bytes_per_sm;
    h.step = -1;
    apply_scenario(st, h);
  }

  ImGui::Separator();
  ImGui::TextUnformatted("Panels");
  const auto& reg = panels();
  bool right = false;  // two checkboxes a line, unless the left one's title is too long to share it
  for (std::size_t k = 0; k < reg.size(); ++k) {
    if (std::string(reg[k].id) == "controls") continue;
    if (right) ImGui::SameLine(170);
    bool v = st.visible[k];
    if (ImGui::Checkbox(reg[k].title, &v)) st.visible[k] = v;
    probe::widget(std::string("controls/panel/") + reg[k].id);
    right = !right && ImGui::GetItemRectMax().x < ImGui::GetWindowPos().x + 165;
  }

  ImGui::Separator();
  static char path[512] = "viz/scenarios/fa2-small.json";
  ImGui::SetNextItemWidth(230);
  // Enter in the field loads too (and, as any Enter, hands the arrow keys back to the transport).
  const bool entered = ImGui::InputText("##scenario", path, sizeof path, ImGuiInputTextFlags_EnterReturnsTrue);
  probe::widget("controls/scenario_file");
  ImGui::SameLine();
  const bool clicked = ImGui::Button("Load");
  if (entered || clicked) {
    try {
      Scenario loaded = load_scenario_file(path);
      if (apply_scenario(st, loaded)) set_visible_from(st, loaded);
    } catch (const InputError& e) {
      st.error = e.what();
    }
  }
}

}  // namespace flashlab::viz
