// UTF-8 helpers with llama.cpp's exact leniency (invalid bytes decode to U+FFFD one byte at a
// time), plus GPT-2's byte <-> printable-codepoint mapping used by byte-level BPE vocabularies.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace lamina::unicode {

// Length of the UTF-8 sequence that starts with this byte, from its high nibble alone
// (continuation bytes count as 1), as llama.cpp's splitters do.
size_t SequenceLength(char first_byte);

// Decodes one codepoint at *offset and advances it. Returns false (without advancing) on an
// invalid or truncated sequence. Overlong forms and surrogates are accepted, like llama.cpp.
bool DecodeOne(std::string_view text, size_t* offset, uint32_t* cpt);

// Whole-string decode; every byte that does not start a valid sequence becomes U+FFFD.
std::vector<uint32_t> Decode(std::string_view text);

// Appends the UTF-8 form of cpt; codepoints above U+10FFFF become U+FFFD.
void AppendUtf8(uint32_t cpt, std::string* out);
std::string Encode(const std::vector<uint32_t>& cpts);

// GPT-2 byte-level mapping: each byte to the UTF-8 text of its printable stand-in codepoint.
const std::string& ByteToUtf8(uint8_t byte);
// Inverse on one codepoint's UTF-8 text; false if the codepoint is not a byte stand-in.
bool Utf8ToByte(std::string_view utf8, uint8_t* byte);

// Number of bytes at the end of text that form an incomplete (but so far valid-looking)
// UTF-8 sequence; 0 when text ends on a character boundary.
size_t IncompleteTailLength(std::string_view text);

}  // namespace lamina::unicode
