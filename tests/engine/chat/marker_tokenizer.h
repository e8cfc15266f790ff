#pragma once

// The micro fixtures' tokenizer with the GLM-4.5, Kimi K2 and DeepSeek-V3 control tokens added as
// special tokens (ids 512 onwards, in kMarkers order), for chat-format and tool-call tests.

#include <doctest/doctest.h>

#include <boost/json.hpp>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "engine/tokenizer/tokenizer.h"

namespace edge::engine::tokenizer {

inline constexpr const char* kMarkers[] = {"[gMASK]",
                                           "<sop>",
                                           "<|system|>",
                                           "<|user|>",
                                           "<|assistant|>",
                                           "<|observation|>",
                                           "<think>",
                                           "</think>",
                                           "<tool_call>",
                                           "</tool_call>",
                                           "<arg_key>",
                                           "</arg_key>",
                                           "<arg_value>",
                                           "</arg_value>",
                                           "<tool_response>",
                                           "</tool_response>",
                                           "<|im_system|>",
                                           "<|im_user|>",
                                           "<|im_assistant|>",
                                           "<|im_middle|>",
                                           "<|tool_calls_section_begin|>",
                                           "<|tool_calls_section_end|>",
                                           "<|tool_call_begin|>",
                                           "<|tool_call_argument_begin|>",
                                           "<|tool_call_end|>",
                                           "<｜begin▁of▁sentence｜>",
                                           "<｜end▁of▁sentence｜>",
                                           "<｜User｜>",
                                           "<｜Assistant｜>",
                                           "<｜tool▁calls▁begin｜>",
                                           "<｜tool▁calls▁end｜>",
                                           "<｜tool▁call▁begin｜>",
                                           "<｜tool▁call▁end｜>",
                                           "<｜tool▁sep｜>",
                                           "<｜tool▁outputs▁begin｜>",
                                           "<｜tool▁outputs▁end｜>",
                                           "<｜tool▁output▁begin｜>",
                                           "<｜tool▁output▁end｜>"};

inline std::unique_ptr<Tokenizer> tokenizer_with_markers() {
    std::ifstream in(std::string(EDGE_SOURCE_DIR) +
                     "/tests/fixtures/micro-qwen3-moe/tokenizer.json");
    std::stringstream ss;
    ss << in.rdbuf();
    boost::json::value root = boost::json::parse(ss.str());
    boost::json::array& added = root.at("added_tokens").as_array();
    int64_t id = 512;
    for (const char* m : kMarkers) {
        boost::json::object t;
        t["id"] = id++;
        t["content"] = m;
        t["single_word"] = false;
        t["lstrip"] = false;
        t["rstrip"] = false;
        t["normalized"] = false;
        t["special"] = true;
        added.push_back(t);
    }
    auto tok = Tokenizer::from_json(boost::json::serialize(root));
    REQUIRE_MESSAGE(tok.ok(), tok.status().to_string());
    return std::move(tok).value();
}

}  // namespace edge::engine::tokenizer
