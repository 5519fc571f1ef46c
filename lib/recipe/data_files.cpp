// Recipe-time checks of the data files a recipe names: a missing file is a mistake in the recipe
// (or the working directory), so it is reported with the other recipe problems, at its key, before
// anything runs. Whether the file's content is usable stays the data module's question.
#include <glob.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "files/files.hpp"
#include "recipe/internal.hpp"

namespace trainctl::recipe::internal {
namespace {

namespace fs = std::filesystem;

// " (relative to /cwd)" for a relative path: says where the search started.
std::string relative_note(const std::string& path) {
  if (fs::path(path).is_absolute()) return "";
  std::error_code ec;
  fs::path cwd = fs::current_path(ec);
  if (ec) return " (relative to the working directory)";
  return fmt::format(" (relative to {})", cwd.string());
}

std::string what_to_give(DataSource source) {
  if (source == DataSource::megatron)
    return "the prefix of a .bin/.idx pair (trainctl data prepare --out PREFIX)";
  return source == DataSource::llmc ? "an llm.c .bin shard or a glob such as dir/train_*.bin"
                                    : "one text file";
}

// Whether `path` names an existing, readable regular file; "" when it does.
std::string check_one_file(DataSource source, const std::string& path) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (status.type() == fs::file_type::not_found)
    return fmt::format("'{}' does not exist{}", path, relative_note(path));
  if (ec) return fmt::format("'{}' cannot be read ({})", path, ec.message());
  if (fs::is_directory(status))
    return fmt::format("'{}' is a directory; give {}", path, what_to_give(source));
  if (!fs::is_regular_file(status))
    return fmt::format("'{}' is not a regular file; give {}", path, what_to_give(source));
  try {
    files::open_regular(path, "data file");  // without blocking: it may change since the stat
  } catch (const files::FileError& e) {
    return fmt::format("'{}' cannot be read ({})", path, e.reason());
  }
  return "";
}

// An llmc glob: at least one match must be a regular file (the data module checks each shard).
std::string check_glob(const std::string& pattern) {
  glob_t matches{};
  const int status = ::glob(pattern.c_str(), 0, nullptr, &matches);
  int files = 0;
  if (status == 0) {
    for (std::size_t i = 0; i < matches.gl_pathc; ++i) {
      std::error_code ec;
      if (fs::is_regular_file(matches.gl_pathv[i], ec)) ++files;
    }
  }
  ::globfree(&matches);
  if (status != 0 && status != GLOB_NOMATCH)
    return fmt::format("'{}' cannot be expanded (glob error {})", pattern, status);
  if (files == 0) return fmt::format("'{}' matches no file{}", pattern, relative_note(pattern));
  return "";
}

}  // namespace

std::string check_data_file(DataSource source, const std::string& path) {
  if (source == DataSource::llmc && path.find_first_of("*?[") != std::string::npos)
    return check_glob(path);
  if (source == DataSource::megatron) {
    // A dataset is named by its prefix: both files of the pair must be there.
    const std::string prefix = data::indexed_prefix(path);
    for (const char* suffix : {".bin", ".idx"})
      if (std::string error = check_one_file(source, prefix + suffix); !error.empty())
        return error +
               fmt::format(" (data.source megatron reads {}.bin and {}.idx)", prefix, prefix);
    return "";
  }
  return check_one_file(source, path);
}

}  // namespace trainctl::recipe::internal
