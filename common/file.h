#pragma once

// Whole-file reads of the small files a checkpoint or a config comes with (JSON, tokenizer
// models): bounded, and only from regular files, so a symlink to /dev/zero or a FIFO in a model
// directory is an error rather than an endless read or a hang.

#include <cstdint>
#include <string>

#include "common/result.h"

namespace edge {

inline constexpr uint64_t kMaxSmallFileBytes = uint64_t{256} << 20;

// The bytes of the regular file at `path`. kNotFound "<path>: cannot open" when it does not exist
// or cannot be opened; kInvalidArgument when it is not a regular file (a directory, a FIFO, a
// device) or holds more than `max_bytes`; kDataLoss when the read fails.
Result<std::string> read_small_file(const std::string& path,
                                    uint64_t max_bytes = kMaxSmallFileBytes);

}  // namespace edge
