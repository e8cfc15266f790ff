// libFuzzer: OpenAI request bodies for both endpoints (the first byte picks the endpoint).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "daemon/api/openai_request.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) {
        return 0;
    }
    auto endpoint = (data[0] & 1) ? edge::daemon::api::Endpoint::kCompletions
                                  : edge::daemon::api::Endpoint::kChatCompletions;
    std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
    auto parsed = edge::daemon::api::parse_openai_request(endpoint, body);
    if (auto* error = std::get_if<edge::daemon::api::ApiError>(&parsed)) {
        (void)error->to_json();
    }
    return 0;
}
