#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <boost/json.hpp>
#include <filesystem>
#include <utility>

#include "common/file.h"
#include "common/json_text.h"
#include "common/log.h"
#include "engine/model/safetensors.h"

// Checkpoint and release_unread_tensors (declared in safetensors.h): the files of a checkpoint
// directory, mapped and joined into one tensor table.

namespace edge::engine {

namespace json = boost::json;

Status Checkpoint::add_file(const std::string& path, bool populate) {
    EDGE_ASSIGN_OR_RETURN(auto file, MappedFile::open(path));
    std::string_view bytes(reinterpret_cast<const char*>(file->data()), file->size());
    // The header first (only its pages are read): a corrupt file is refused before its weights
    // are read.
    EDGE_ASSIGN_OR_RETURN(SafetensorsHeader header,
                          parse_safetensors_header(bytes, file->size(), path));
    if (populate) {
        EDGE_RETURN_IF_ERROR(file->populate());
    }
    auto owned = std::make_unique<SafetensorsHeader>(std::move(header));
    size_t index = files_.size();
    for (const TensorInfo& info : owned->tensors) {
        if (entries_.count(info.name) != 0) {
            return data_loss_error(path + ": tensor '" + info.name + "' is also in " +
                                   files_[entries_.find(info.name)->second.file]->path());
        }
        entries_.emplace(info.name, Entry{index, &info});
    }
    files_.push_back(std::move(file));
    headers_.push_back(std::move(owned));
    return ok_status();
}

Result<std::unique_ptr<Checkpoint>> Checkpoint::open_files(const std::vector<std::string>& paths,
                                                           bool populate) {
    auto ckpt = std::unique_ptr<Checkpoint>(new Checkpoint());
    for (const std::string& p : paths) {
        EDGE_RETURN_IF_ERROR(ckpt->add_file(p, populate));
    }
    ckpt->description_ = paths.size() == 1 ? paths[0] : std::to_string(paths.size()) + " files";
    return ckpt;
}

Result<std::unique_ptr<Checkpoint>> Checkpoint::open_dir(const std::string& dir, bool populate) {
    const std::string index_path = dir + "/model.safetensors.index.json";
    std::error_code missing;
    if (!std::filesystem::exists(index_path, missing)) {
        return open_files({dir + "/model.safetensors"}, populate);
    }
    EDGE_ASSIGN_OR_RETURN(std::string index_text, read_small_file(index_path));
    EDGE_ASSIGN_OR_RETURN(const json::object root,
                          parse_json_object(index_text, index_path, StatusCode::kDataLoss));
    const json::value* map = root.if_contains("weight_map");
    if (map == nullptr || !map->is_object()) {
        return data_loss_error(index_path + ": missing object 'weight_map'");
    }
    std::vector<std::string> shards;
    std::map<std::string, std::string> wanted;
    for (const auto& kv : map->get_object()) {
        if (!kv.value().is_string()) {
            return data_loss_error(index_path + ": weight_map entry '" + std::string(kv.key()) +
                                   "' is not a file name");
        }
        std::string shard(kv.value().get_string());
        if (shard.empty() || shard.find('/') != std::string::npos || shard == "." ||
            shard == "..") {
            return data_loss_error(index_path + ": weight_map entry '" + std::string(kv.key()) +
                                   "' names an invalid file '" + shard + "'");
        }
        if (std::find(shards.begin(), shards.end(), shard) == shards.end()) {
            shards.push_back(shard);
        }
        wanted[std::string(kv.key())] = shard;
    }
    std::vector<std::string> paths;
    for (const std::string& s : shards) {
        paths.push_back(dir + "/" + s);
    }
    EDGE_ASSIGN_OR_RETURN(auto ckpt, open_files(paths, populate));
    for (const auto& [name, shard] : wanted) {
        auto it = ckpt->entries_.find(name);
        if (it == ckpt->entries_.end()) {
            return data_loss_error(index_path + ": tensor '" + name + "' is not in " + shard);
        }
        if (ckpt->files_[it->second.file]->path() != dir + "/" + shard) {
            return data_loss_error(index_path + ": tensor '" + name + "' is listed in " + shard +
                                   " but found in " + ckpt->files_[it->second.file]->path());
        }
    }
    ckpt->description_ = index_path;
    return ckpt;
}

bool Checkpoint::has(std::string_view name) const { return entries_.find(name) != entries_.end(); }

const TensorInfo* Checkpoint::info(std::string_view name) const {
    auto it = entries_.find(name);
    return it == entries_.end() ? nullptr : it->second.info;
}

std::vector<std::string> Checkpoint::unread_names() const {
    std::lock_guard lock(read_mu_);
    std::vector<std::string> out;
    for (const auto& [name, entry] : entries_) {
        if (!read_.contains(name)) {
            out.push_back(name);
        }
    }
    return out;
}

int64_t release_unread_tensors(const Checkpoint& checkpoint) {
    const std::vector<std::string> unread = checkpoint.unread_names();
    if (unread.empty()) {
        return 0;
    }
    int64_t bytes = 0;
    std::string first;
    for (size_t i = 0; i < unread.size(); ++i) {
        if (const TensorInfo* t = checkpoint.info(unread[i])) {
            bytes += t->end - t->begin;
            release_mapped_pages(checkpoint.mapped_data(unread[i]), t->end - t->begin);
        }
        if (i < 4) {
            first += (first.empty() ? "" : ", ") + unread[i];
        }
    }
    log::warn("checkpoint_tensors_unused",
              {{"checkpoint", checkpoint.description()},
               {"count", static_cast<uint64_t>(unread.size())},
               {"bytes", bytes},
               {"first", first},
               {"detail",
                "the model does not read them: config.json may not describe this "
                "checkpoint (num_hidden_layers, num_experts, ...), or they belong to a "
                "part the engine does not run (DeepSeek-V3's multi-token prediction "
                "layer); their pages are released"}});
    return bytes;
}

void Checkpoint::content_sample(size_t n, const std::function<void(std::string_view)>& feed) const {
    struct Fds {
        std::vector<int> fd;
        ~Fds() {
            for (int f : fd) {
                if (f >= 0) {
                    ::close(f);
                }
            }
        }
    } fds{std::vector<int>(files_.size(), -1)};
    std::vector<char> buf(n);
    for (const auto& [name, entry] : entries_) {
        int& fd = fds.fd[entry.file];
        if (fd < 0) {
            fd = ::open(files_[entry.file]->path().c_str(), O_RDONLY | O_CLOEXEC);
            if (fd < 0) {
                return;
            }
            ::posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
        }
        const int64_t base = headers_[entry.file]->data_offset + entry.info->begin;
        const int64_t size = entry.info->end - entry.info->begin;
        const int64_t take = std::min<int64_t>(static_cast<int64_t>(n), size);
        for (int64_t at : {int64_t{0}, (size - take) / 2, size - take}) {
            if (::pread(fd, buf.data(), static_cast<size_t>(take), base + at) != take) {
                return;
            }
            feed(std::string_view(buf.data(), static_cast<size_t>(take)));
        }
    }
}

const void* Checkpoint::mapped_data(std::string_view name) const {
    auto it = entries_.find(name);
    if (it == entries_.end()) {
        return nullptr;
    }
    return files_[it->second.file]->data() + headers_[it->second.file]->data_offset +
           it->second.info->begin;
}

Result<TensorView> Checkpoint::tensor(std::string_view name) const {
    auto it = entries_.find(name);
    if (it == entries_.end()) {
        return not_found_error(description_ + ": tensor '" + std::string(name) + "' is missing");
    }
    {
        std::lock_guard lock(read_mu_);
        read_.insert(it->first);
    }
    const MappedFile& f = *files_[it->second.file];
    const SafetensorsHeader& h = *headers_[it->second.file];
    TensorView v;
    v.info = it->second.info;
    v.file = &f.path();
    v.data = f.data() + h.data_offset + v.info->begin;
    v.nbytes = v.info->end - v.info->begin;
    return v;
}

Result<TensorView> Checkpoint::tensor(std::string_view name, const std::vector<DType>& allowed,
                                      const std::vector<int64_t>& shape) const {
    EDGE_ASSIGN_OR_RETURN(TensorView v, tensor(name));
    if (std::find(allowed.begin(), allowed.end(), v.dtype()) == allowed.end()) {
        std::string want;
        for (DType d : allowed) {
            want += (want.empty() ? "" : "/") + std::string(dtype_name(d));
        }
        return invalid_argument_error(*v.file + ": tensor '" + std::string(name) + "' has dtype " +
                                      std::string(dtype_name(v.dtype())) + ", expected " + want);
    }
    if (v.shape() != shape) {
        return invalid_argument_error(*v.file + ": tensor '" + std::string(name) + "' has shape " +
                                      shape_string(v.shape()) + ", expected " +
                                      shape_string(shape));
    }
    return v;
}

std::vector<std::string> Checkpoint::names() const {
    std::vector<std::string> out;
    for (const auto& kv : entries_) {
        out.push_back(kv.first);
    }
    return out;
}

int64_t Checkpoint::total_bytes() const {
    int64_t total = 0;
    for (const auto& kv : entries_) {
        total += kv.second.info->end - kv.second.info->begin;
    }
    return total;
}

}  // namespace edge::engine
