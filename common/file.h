#pragma once

// Whole-file reads of the small files a checkpoint or a config comes with (JSON, tokenizer
// models): bounded, and only from regular files, so a symlink to /dev/zero or a FIFO in a model
// directory is an error rather than an endless read or a hang. And the durable writes of the
// files the daemon and its tools keep (checkpoints, the gossip snapshot).

#include <cstdint>
#include <string>
#include <string_view>

#include "common/result.h"

namespace edge {

inline constexpr uint64_t kMaxSmallFileBytes = uint64_t{256} << 20;

// The bytes of the regular file at `path`. kNotFound "<path>: cannot open" when it does not exist
// or cannot be opened; kInvalidArgument when it is not a regular file (a directory, a FIFO, a
// device) or holds more than `max_bytes`; kDataLoss when the read fails.
Result<std::string> read_small_file(const std::string& path,
                                    uint64_t max_bytes = kMaxSmallFileBytes);

// fsync(2)s the regular file or directory at `path`, opened read-only (fsync flushes the inode,
// whichever descriptor asks). A durable rename needs both: the file's bytes before it is renamed
// into place, its directory after, or a power loss can keep the new name without the bytes.
// kInternal naming `path` when it cannot be opened or synced.
Status fsync_path(const std::string& path);

// Writes `text` to `path` atomically: `path`.tmp created afresh (O_EXCL | O_NOFOLLOW, mode 0600;
// a stale one or a symlink there is removed first), written, fsynced, renamed over `path`, and
// the directory fsynced. kUnavailable naming the step that failed; `path` is then as it was.
Status write_file_atomically(const std::string& path, std::string_view text);

}  // namespace edge
