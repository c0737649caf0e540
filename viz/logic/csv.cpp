#include "csv.hpp"

#include <fstream>
#include <sstream>

namespace flashlab::viz {

std::string counters_csv(const Replay& r) {
  std::ostringstream os;
  const Trace& t = r.trace();
  os << "# algorithm=" << to_string(t.algorithm) << " seq_q=" << t.problem.shape.seq_q
     << " seq_k=" << t.problem.shape.seq_k << " head_dim=" << t.problem.shape.head_dim << " Br=" << t.tiling.Br
     << " Bc=" << t.tiling.Bc << " step=" << r.step() << "/" << r.size() << "\n";
  os << "tensor,read_bytes,written_bytes,final_read_bytes,final_written_bytes\n";
  for (int k = 0; k < static_cast<int>(TensorId::Count); ++k) {
    const auto& now = r.totals();
    if (t.totals.read[k] == 0 && t.totals.written[k] == 0) continue;
    os << to_string(static_cast<TensorId>(k)) << ',' << now.read[k] << ',' << now.written[k] << ','
       << t.totals.read[k] << ',' << t.totals.written[k] << '\n';
  }
  os << "total," << r.totals().total_read() << ',' << r.totals().total_written() << ',' << t.totals.total_read()
     << ',' << t.totals.total_written() << '\n';
  os << "peak_sram_bytes," << r.totals().peak_sram_bytes << ",," << t.totals.peak_sram_bytes << ",\n";
  return os.str();
}

std::string sweep_csv(const TrafficSweep& s, const CpuTiming& c) {
  std::ostringstream os;
  os << "algorithm,n,hbm_bytes,compulsory_bytes,footprint_bytes,peak_sram_bytes,flops,events\n";
  for (std::size_t a = 0; a < s.algorithms.size() && a < s.points.size(); ++a)
    for (const SweepPoint& p : s.points[a])
      os << to_string(s.algorithms[a]) << ',' << p.n << ',' << p.hbm_bytes << ',' << p.compulsory_bytes << ','
         << p.footprint_bytes << ',' << p.peak_sram_bytes << ',' << p.flops << ',' << p.events << '\n';
  if (!c.series.empty()) {
    os << "\nseries,n,seconds\n";
    for (const Series& ser : c.series)
      for (std::size_t k = 0; k < ser.x.size(); ++k) os << ser.name << ',' << ser.x[k] << ',' << ser.y[k] << '\n';
  }
  return os.str();
}

void write_text_file(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  if (!out) throw InputError("cannot write '" + path + "'");
  out << text;
  if (!out) throw InputError("writing '" + path + "' failed");
}

}  // namespace flashlab::viz
