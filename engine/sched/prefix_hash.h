#pragma once

// Prefix-cache keys. A full block of a prompt is named by a chain hash: SHA-256 over the parent
// block's hash (32 zero bytes for the first block), the block's token ids (little-endian int32)
// and the tenant's salt. The salt is derived on the server from a per-process secret and the
// tenant's configured name (never from anything a client sends), so equal prompts of different
// tenants never share blocks and a tenant cannot probe another's cache.
//
// Threading: pure functions.

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "engine/generator.h"
#include "engine/model/block_pool.h"

namespace edge::engine::sched {

// SHA-256("edgeserve prefix salt" || secret || tenant).
BlockHash tenant_salt(std::string_view secret, std::string_view tenant);

// Chain hashes of the first min(tokens.size() / block_tokens, max_blocks) full blocks.
std::vector<BlockHash> prefix_chain(std::span<const TokenId> tokens, int32_t block_tokens,
                                    const BlockHash& salt, size_t max_blocks);

}  // namespace edge::engine::sched
