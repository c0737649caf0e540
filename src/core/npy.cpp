// NumPy .npy files, so NumPy / PyTorch users can feed FlashLab their own tensors and check its
// outputs. The format (numpy.lib.format): the magic "\x93NUMPY", a version byte pair, the header
// length (2 bytes little-endian in 1.0, 4 bytes in 2.0/3.0), then an ASCII (3.0: UTF-8) Python dict
// literal {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } padded with spaces and a final
// newline, then the raw C-order data. We read and write the three little-endian float dtypes, and write
// uint8 ('|u1') for e4m3 bytes, which have no NumPy dtype of their own.
#include "core/npy.hpp"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <system_error>

#include "core/half.hpp"

namespace flashlab {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr std::size_t kMagicBytes = 6;
constexpr std::size_t kPreludeV1 = kMagicBytes + 2 + 2;  // magic, version, uint16 header length
constexpr std::size_t kPreludeV2 = kMagicBytes + 2 + 4;  // magic, version, uint32 header length
// NumPy pads the header so the data starts on a 64-byte boundary (aligned loads when memory-mapped).
constexpr std::size_t kHeaderAlign = 64;

[[noreturn]] void fail(const std::string& path, const std::string& what) { throw InputError("'" + path + "' " + what); }

std::uint32_t read_le(const unsigned char* p, int bytes) {
  std::uint32_t v = 0;
  for (int n = bytes - 1; n >= 0; --n) v = (v << 8) | p[n];
  return v;
}

// A cursor over the header's dict literal. It understands exactly what NumPy writes: quoted strings,
// True/False, and tuples of non-negative integers, separated by commas, with free whitespace.
class HeaderParser {
 public:
  HeaderParser(const std::string& text, const std::string& path) : s_(text), path_(path) {}

  void skip_space() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }
  bool accept(char c) {
    skip_space();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!accept(c)) bad(std::string("expected '") + c + "'");
  }
  std::string string_literal() {
    skip_space();
    if (pos_ >= s_.size() || (s_[pos_] != '\'' && s_[pos_] != '"')) bad("expected a quoted string");
    const char quote = s_[pos_++];
    const std::size_t end = s_.find(quote, pos_);
    if (end == std::string::npos) bad("unterminated string");
    std::string out = s_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return out;
  }
  bool boolean() {
    skip_space();
    for (const char* word : {"True", "False"}) {
      const std::size_t n = std::strlen(word);
      if (s_.compare(pos_, n, word) == 0) {
        pos_ += n;
        return word[0] == 'T';
      }
    }
    bad("expected True or False");
  }
  std::vector<std::int64_t> shape_tuple() {
    expect('(');
    std::vector<std::int64_t> dims;
    while (!accept(')')) {
      skip_space();
      if (pos_ >= s_.size() || s_[pos_] < '0' || s_[pos_] > '9') bad("expected a non-negative integer in the shape");
      std::int64_t v = 0;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
        if (v > (std::numeric_limits<std::int64_t>::max() - 9) / 10) bad("shape extent is too large");
        v = v * 10 + (s_[pos_++] - '0');
      }
      if (pos_ < s_.size() && s_[pos_] == 'L') ++pos_;  // Python 2 long suffix, written by old NumPy
      dims.push_back(v);
      if (!accept(',')) {
        expect(')');
        break;
      }
    }
    return dims;
  }
  [[noreturn]] void bad(const std::string& what) const {
    fail(path_,
         "has a malformed .npy header (" + what + " at character " + std::to_string(pos_) + " of \"" + s_ + "\")");
  }

 private:
  const std::string& s_;
  const std::string& path_;
  std::size_t pos_ = 0;
};

struct Header {
  std::string descr;
  bool fortran_order = false;
  std::vector<std::int64_t> shape;
};

Header parse_header(std::string text, const std::string& path) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ' || text.back() == '\0')) text.pop_back();
  HeaderParser p(text, path);
  Header h;
  bool have_descr = false, have_order = false, have_shape = false;
  p.expect('{');
  while (!p.accept('}')) {
    const std::string key = p.string_literal();
    p.expect(':');
    if (key == "descr") {
      h.descr = p.string_literal();
      have_descr = true;
    } else if (key == "fortran_order") {
      h.fortran_order = p.boolean();
      have_order = true;
    } else if (key == "shape") {
      h.shape = p.shape_tuple();
      have_shape = true;
    } else {
      p.bad("unknown key '" + key + "'");
    }
    if (!p.accept(',')) {
      p.expect('}');
      break;
    }
  }
  if (!have_descr || !have_order || !have_shape) p.bad("the keys descr, fortran_order and shape are all required");
  return h;
}

// Maps a dtype descriptor to ours, or explains why it is not supported.
DType dtype_from_descr(const std::string& descr, const std::string& path) {
  const std::string supported = ": supported are little-endian float64, float32 and float16 ('<f8', '<f4', '<f2')";
  if (descr.size() == 3 && descr[0] == '>' && descr[1] == 'f')
    fail(path, "is big-endian ('" + descr + "')" + supported);
  if (descr == "<f8") return DType::F64;
  if (descr == "<f4") return DType::F32;
  if (descr == "<f2") return DType::F16;
  fail(path, "has dtype '" + descr + "', which FlashLab does not read" + supported);
}

const char* descr_of(DType t) {
  switch (t) {
    case DType::F64: return "<f8";
    case DType::F32: return "<f4";
    case DType::F16: return "<f2";
    case DType::BF16: break;  // NumPy has no bfloat16
    case DType::E4M3: break;  // nor a float8: write_npy_u8 writes e4m3 bytes as uint8
  }
  return nullptr;
}

// The values are decoded from little-endian bytes one by one: no alignment or host-endianness
// assumptions, and the cost is nothing next to attention itself.
double decode(const unsigned char* p, DType t) {
  switch (t) {
    case DType::F64: {
      std::uint64_t u = 0;
      for (int n = 7; n >= 0; --n) u = (u << 8) | p[n];
      double d;
      std::memcpy(&d, &u, 8);
      return d;
    }
    case DType::F32: return bits_to_float(read_le(p, 4));
    case DType::F16: return f16_bits_to_float(static_cast<std::uint16_t>(read_le(p, 2)));
    case DType::BF16:
    case DType::E4M3: break;  // never read: dtype_from_descr returns neither
  }
  return 0;
}

void encode(double x, DType t, unsigned char* p) {
  std::uint64_t u = 0;
  int bytes = 0;
  switch (t) {
    case DType::F64: std::memcpy(&u, &x, 8), bytes = 8; break;
    case DType::F32: u = float_to_bits(static_cast<float>(x)), bytes = 4; break;
    case DType::F16: u = float_to_f16_bits(static_cast<float>(x)), bytes = 2; break;
    case DType::BF16:
    case DType::E4M3: break;  // never written: write_npy refuses both first
  }
  for (int n = 0; n < bytes; ++n) p[n] = static_cast<unsigned char>(u >> (8 * n));
}

}  // namespace

NpyArray read_npy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot be opened for reading");
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto* u = reinterpret_cast<const unsigned char*>(bytes.data());

  if (bytes.size() < kPreludeV1 || bytes.compare(0, kMagicBytes, kMagic, kMagicBytes) != 0)
    fail(path, "is not a .npy file (it does not start with the magic string \\x93NUMPY)");
  const int major = u[kMagicBytes], minor = u[kMagicBytes + 1];
  if (major < 1 || major > 3 || minor != 0)
    fail(path, "has .npy format version " + std::to_string(major) + "." + std::to_string(minor) +
                   ": supported are 1.0, 2.0 and 3.0");
  const std::size_t prelude = major == 1 ? kPreludeV1 : kPreludeV2;
  if (bytes.size() < prelude) fail(path, "is truncated inside its .npy header");
  const std::size_t header_len = read_le(u + kMagicBytes + 2, major == 1 ? 2 : 4);
  if (bytes.size() - prelude < header_len)
    fail(path, "is truncated inside its .npy header (it declares " + std::to_string(header_len) + " header bytes)");
  const Header h = parse_header(bytes.substr(prelude, header_len), path);

  NpyArray out;
  out.dtype = dtype_from_descr(h.descr, path);
  if (h.fortran_order)
    fail(path, "is in Fortran (column-major) order: save it in C order, e.g. with numpy.ascontiguousarray");

  const int item = dtype_bytes(out.dtype);
  std::uint64_t count = 1;
  for (std::int64_t d : h.shape) {
    if (d != 0 && count > std::numeric_limits<std::uint64_t>::max() / 8 / static_cast<std::uint64_t>(d))
      fail(path, "declares a shape too large to hold in memory");
    count *= static_cast<std::uint64_t>(d);
  }
  const std::uint64_t data_bytes = count * item;
  const std::uint64_t have = bytes.size() - prelude - header_len;
  if (have < data_bytes)
    fail(path, "is truncated: its shape needs " + std::to_string(data_bytes) + " data bytes but the file has " +
                   std::to_string(have));
  if (have > data_bytes)
    fail(path, "has " + std::to_string(have - data_bytes) +
                   " bytes after the data its shape declares, so the header and the data disagree");

  out.tensor.dims = h.shape;
  out.tensor.data.resize(count);
  const unsigned char* data = u + prelude + header_len;
  for (std::uint64_t n = 0; n < count; ++n) out.tensor.data[n] = decode(data + n * item, out.dtype);
  return out;
}

namespace {

// The magic, version, header length and header of a C-order .npy file of `descr` and `dims`, padded so that the
// data starts on a 64-byte boundary; the data follows.
std::string npy_prelude(const char* descr, const std::vector<std::int64_t>& dims) {
  std::ostringstream dict;
  dict << "{'descr': '" << descr << "', 'fortran_order': False, 'shape': (";
  for (std::size_t n = 0; n < dims.size(); ++n) dict << (n ? ", " : "") << dims[n];
  dict << (dims.size() == 1 ? ",), }" : "), }");  // Python writes a 1-tuple as (3,)
  std::string header = dict.str();

  // Version 1.0 unless the header needs more than 65535 bytes (only for thousands of dimensions).
  std::size_t prelude = kPreludeV1;
  if (header.size() + 1 + kHeaderAlign > 0xffff) prelude = kPreludeV2;
  const std::size_t unpadded = prelude + header.size() + 1;  // + the final newline
  header.append((kHeaderAlign - unpadded % kHeaderAlign) % kHeaderAlign, ' ');
  header.push_back('\n');

  std::string file(kMagic, kMagicBytes);
  file.push_back(static_cast<char>(prelude == kPreludeV1 ? 1 : 2));
  file.push_back(0);
  const std::uint32_t len = static_cast<std::uint32_t>(header.size());
  for (std::size_t n = 0; n < prelude - kMagicBytes - 2; ++n) file.push_back(static_cast<char>(len >> (8 * n)));
  file += header;
  return file;
}

void write_file(const std::string& path, const std::string& file) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw InputError("cannot open '" + path + "' for writing");
  out.write(file.data(), static_cast<std::streamsize>(file.size()));
  if (!out) throw InputError("could not write all of '" + path + "' (disk full?)");
}

}  // namespace

void write_npy(const std::string& path, const HostTensor& t, DType dtype) {
  const char* descr = descr_of(dtype);
  if (!descr)
    throw InputError("cannot write '" + path + "' as " + to_string(dtype) + ": NumPy has no " +
                     (dtype == DType::E4M3 ? "float8 dtype (write e4m3 bytes as uint8)" : "bfloat16 dtype") +
                     ", so .npy files are written as f64, f32 or f16");
  std::string file = npy_prelude(descr, t.dims);
  const int item = dtype_bytes(dtype);
  const std::size_t start = file.size();
  file.resize(start + t.data.size() * item);
  auto* data = reinterpret_cast<unsigned char*>(file.data() + start);
  for (std::size_t n = 0; n < t.data.size(); ++n) encode(t.data[n], dtype, data + n * item);
  write_file(path, file);
}

void write_npy_u8(const std::string& path, const std::vector<std::int64_t>& dims,
                  const std::vector<std::uint8_t>& bytes) {
  std::size_t count = 1;
  for (std::int64_t d : dims) count *= static_cast<std::size_t>(d);
  if (count != bytes.size())
    throw std::logic_error("write_npy_u8: the shape holds " + std::to_string(count) + " elements, but " +
                           std::to_string(bytes.size()) + " bytes were given");
  std::string file = npy_prelude("|u1", dims);
  file.append(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  write_file(path, file);
}

std::vector<std::string> write_e4m3_npy(const std::string& dir, const Shape& s, const E4m3Qkv& in) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error || !std::filesystem::is_directory(dir))
    throw InputError("cannot make the folder '" + dir + "' for the quantized inputs" +
                     (error ? " (" + error.message() + ")" : std::string(" (a file of that name exists)")));
  const std::filesystem::path folder(dir);
  std::vector<std::string> written;
  const auto bytes = [&](const char* name, const std::vector<std::int64_t>& dims, const std::vector<std::uint8_t>& b) {
    written.push_back((folder / name).string());
    write_npy_u8(written.back(), dims, b);
  };
  const auto descales = [&](const char* name, int heads, const std::vector<float>& d) {
    HostTensor t({s.batch, heads});
    if (d.size() != t.data.size())
      throw std::logic_error(std::string("write_e4m3_npy: ") + name + " gets " + std::to_string(d.size()) +
                             " descales for " + std::to_string(t.data.size()) + " (batch, head) pairs");
    std::copy(d.begin(), d.end(), t.data.begin());  // floats: exact in double, and again as float32
    written.push_back((folder / name).string());
    write_npy(written.back(), t, DType::F32);
  };
  bytes("q.npy", q_dims(s), in.q);
  bytes("k.npy", kv_dims(s), in.k);
  bytes("v.npy", kv_dims(s), in.v);
  descales("q_descale.npy", s.heads_q, in.q_descale);
  descales("k_descale.npy", s.heads_kv, in.k_descale);
  descales("v_descale.npy", s.heads_kv, in.v_descale);
  return written;
}

}  // namespace flashlab
