// UTF-8 decoding/encoding and the GPT-2 byte-to-unicode table (see unicode.h).
#include "tokenizer/unicode.h"

#include <array>
#include <unordered_map>

namespace lamina::unicode {

size_t SequenceLength(char first_byte) {
  static constexpr size_t kLookup[] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLookup[static_cast<uint8_t>(first_byte) >> 4];
}

bool DecodeOne(std::string_view s, size_t* offset, uint32_t* cpt) {
  const size_t i = *offset;
  auto b = [&](size_t k) { return static_cast<uint8_t>(s[i + k]); };
  auto cont = [&](size_t k) { return i + k < s.size() && (b(k) & 0xC0) == 0x80; };
  const uint8_t c0 = b(0);
  if (!(c0 & 0x80)) {
    *cpt = c0;
    *offset += 1;
    return true;
  }
  if (!(c0 & 0x40)) return false;
  if (!(c0 & 0x20)) {
    if (!cont(1)) return false;
    *cpt = ((c0 & 0x1Fu) << 6) | (b(1) & 0x3Fu);
    *offset += 2;
    return true;
  }
  if (!(c0 & 0x10)) {
    if (!cont(1) || !cont(2)) return false;
    *cpt = ((c0 & 0x0Fu) << 12) | ((b(1) & 0x3Fu) << 6) | (b(2) & 0x3Fu);
    *offset += 3;
    return true;
  }
  if (!(c0 & 0x08)) {
    if (!cont(1) || !cont(2) || !cont(3)) return false;
    *cpt = ((c0 & 0x07u) << 18) | ((b(1) & 0x3Fu) << 12) | ((b(2) & 0x3Fu) << 6) | (b(3) & 0x3Fu);
    *offset += 4;
    return true;
  }
  return false;
}

std::vector<uint32_t> Decode(std::string_view text) {
  std::vector<uint32_t> out;
  out.reserve(text.size());
  size_t offset = 0;
  while (offset < text.size()) {
    uint32_t cpt;
    if (DecodeOne(text, &offset, &cpt)) {
      out.push_back(cpt);
    } else {
      ++offset;
      out.push_back(0xFFFD);
    }
  }
  return out;
}

void AppendUtf8(uint32_t cpt, std::string* out) {
  if (cpt <= 0x7F) {
    out->push_back(static_cast<char>(cpt));
  } else if (cpt <= 0x7FF) {
    out->push_back(static_cast<char>(0xC0 | ((cpt >> 6) & 0x1F)));
    out->push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  } else if (cpt <= 0xFFFF) {
    out->push_back(static_cast<char>(0xE0 | ((cpt >> 12) & 0x0F)));
    out->push_back(static_cast<char>(0x80 | ((cpt >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  } else if (cpt <= 0x10FFFF) {
    out->push_back(static_cast<char>(0xF0 | ((cpt >> 18) & 0x07)));
    out->push_back(static_cast<char>(0x80 | ((cpt >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cpt >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  } else {
    AppendUtf8(0xFFFD, out);
  }
}

std::string Encode(const std::vector<uint32_t>& cpts) {
  std::string out;
  out.reserve(cpts.size());
  for (uint32_t c : cpts) AppendUtf8(c, &out);
  return out;
}

namespace {

struct ByteTables {
  std::array<std::string, 256> byte_to_utf8;
  std::unordered_map<std::string, uint8_t> utf8_to_byte;
};

// GPT-2's bytes_to_unicode(): printable Latin-1 bytes map to themselves, the rest to
// U+0100 onwards in byte order.
const ByteTables& Tables() {
  static const ByteTables tables = [] {
    ByteTables t;
    std::array<bool, 256> direct{};
    for (int c = 0x21; c <= 0x7E; ++c) direct[c] = true;
    for (int c = 0xA1; c <= 0xAC; ++c) direct[c] = true;
    for (int c = 0xAE; c <= 0xFF; ++c) direct[c] = true;
    uint32_t next = 256;
    for (int c = 0; c < 256; ++c) {
      const uint32_t cpt = direct[c] ? static_cast<uint32_t>(c) : next++;
      std::string s;
      AppendUtf8(cpt, &s);
      t.byte_to_utf8[c] = s;
      t.utf8_to_byte.emplace(s, static_cast<uint8_t>(c));
    }
    return t;
  }();
  return tables;
}

}  // namespace

const std::string& ByteToUtf8(uint8_t byte) { return Tables().byte_to_utf8[byte]; }

bool Utf8ToByte(std::string_view utf8, uint8_t* byte) {
  const auto& map = Tables().utf8_to_byte;
  auto it = map.find(std::string(utf8));
  if (it == map.end()) return false;
  *byte = it->second;
  return true;
}

size_t IncompleteTailLength(std::string_view text) {
  // Walk back over at most 3 continuation bytes to the last lead byte.
  const size_t n = text.size();
  for (size_t back = 1; back <= 4 && back <= n; ++back) {
    const uint8_t c = static_cast<uint8_t>(text[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte
    size_t need = 0;
    if ((c & 0xE0) == 0xC0) {
      need = 2;
    } else if ((c & 0xF0) == 0xE0) {
      need = 3;
    } else if ((c & 0xF8) == 0xF0) {
      need = 4;
    } else {
      return 0;  // ASCII or an invalid lead byte: nothing worth waiting for
    }
    return back < need ? back : 0;
  }
  return 0;
}

}  // namespace lamina::unicode
