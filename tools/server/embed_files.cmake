# Writes a C++ source that holds the bytes of some files (the web page's files, tools/server/web/),
# run at build time by CMakeLists.txt: cmake -DOUTPUT=out.cpp -DFILES="a;b" -P embed_files.cmake.
# The source defines lamina::cli::EmbeddedWebFiles() (web_files.h): one {name, bytes} per file,
# named by its file name without the folder.
cmake_minimum_required(VERSION 3.25)
if(NOT OUTPUT OR NOT FILES)
  message(FATAL_ERROR "usage: cmake -DOUTPUT=out.cpp -DFILES=\"a;b\" -P embed_files.cmake")
endif()

set(arrays "")
set(entries "")
set(names "")
set(index 0)
string(REPEAT "[0-9a-f]" 40 line_of_hex)  # CMake's regular expressions have no {n}
foreach(path IN LISTS FILES)
  get_filename_component(name "${path}" NAME)
  file(READ "${path}" hex HEX)
  file(SIZE "${path}" size)
  # Two hex digits a byte; 20 bytes a line; a trailing 0 so that an empty file is a valid array.
  string(REGEX REPLACE "(${line_of_hex})" "\\1\n    " hex "${hex}")
  string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
  string(APPEND arrays "// ${name}\nconst unsigned char kFile${index}[] = {\n    ${bytes}0x00};\n")
  string(APPEND entries
         "      {\"${name}\", {reinterpret_cast<const char*>(kFile${index}), ${size}}},\n")
  string(APPEND names " ${name}")
  math(EXPR index "${index} + 1")
endforeach()

set(source "// Generated at build time by tools/server/embed_files.cmake from:${names}. Do not edit.
#include \"web_files.h\"

namespace lamina::cli {
namespace {

${arrays}
}  // namespace

std::span<const EmbeddedFile> EmbeddedWebFiles() {
  static const EmbeddedFile kFiles[] = {
${entries}  };
  return kFiles;
}

}  // namespace lamina::cli
")
# Rewritten only when it changes, so an unchanged page compiles nothing.
if(EXISTS "${OUTPUT}")
  file(READ "${OUTPUT}" old)
  if(old STREQUAL source)
    return()
  endif()
endif()
file(WRITE "${OUTPUT}" "${source}")
