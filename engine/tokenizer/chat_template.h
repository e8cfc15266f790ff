#pragma once

// ChatTemplate renders chat `messages` into prompt token ids for one model family. The family is
// chosen from the checkpoint (the shipped Jinja template's markers) or named in the model config;
// we do not run Jinja: each family is a small renderer written to match its template. Today:
// ChatML (Qwen, with Qwen3's Hermes-style tools block), GLM-4.5, Kimi K2 and DeepSeek-V3, each with
// the system, user, assistant (including its earlier tool calls) and tool roles, and OpenAI `tools`
// rendered into the prompt the way the family's shipped template does (DeepSeek-V3's template has
// no place for tools: ours declares them after the system prompt).
//
// Control tokens are inserted as ids and message text is encoded with special-token parsing off,
// so a message cannot inject `<|im_start|>`. Markers that a vocabulary may or may not hold as one
// token (`<tool_call>`, `<arg_key>`, ...) are inserted as their id when it exists, else as text.
// Threading: immutable; thread-safe.

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "engine/generator.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/tokenizer_config.h"

namespace edge::engine::tokenizer {

enum class ChatFormat {
    kChatMl,  // <|im_start|>{role}\n{content}<|im_end|>\n ..., then <|im_start|>assistant\n
    // The same whose assistant turn opens the thought, <|im_start|>assistant\n<think>\n: the
    // thinking-only Qwen3 (-Thinking-2507) and QwQ, which write </think> but no <think>.
    kChatMlThinking,
    kGlm45,   // [gMASK]<sop><|system|>\n...<|user|>\n...<|assistant|>
    kKimiK2,  // <|im_user|>user<|im_middle|>...<|im_end|>...<|im_assistant|>assistant<|im_middle|>
    kDeepSeekV3,  // <｜begin▁of▁sentence｜>{system}<｜User｜>...<｜Assistant｜>...<｜end▁of▁sentence｜>
    kDeepSeekV31,  // V3.1, non-thinking: ...<｜User｜>...<｜Assistant｜></think>...
};

// The names choose_chat_format() accepts besides "auto", for messages that list them.
inline constexpr std::string_view kChatFormatNames =
    "chatml, chatml_thinking, glm4_5, kimi_k2, deepseek_v3, deepseek_v3_1";

// The tool-call output format the family writes, as named by engine/chat/tool_call_parser.h's
// tool_call_format_from_name(): "hermes" (ChatML / Qwen3), "glm4_5", "kimi_k2", "deepseek_v3",
// "deepseek_v3_1".
std::string_view tool_call_format_of(ChatFormat format);

// "chatml" -> kChatMl, "chatml_thinking" -> kChatMlThinking, "glm4_5" -> kGlm45, "kimi_k2" ->
// kKimiK2, "deepseek_v3" -> kDeepSeekV3, "deepseek_v3_1" -> kDeepSeekV31; "auto" (or "") -> from
// the checkpoint's template (ChatML whose assistant turn opens with <think> is kChatMlThinking),
// else (no template) from its vocabulary. DeepSeek-V3's template is told from V3.1's (which has a
// `thinking` switch and </think>) and from R1's (<think> without the switch), which is not
// recognised: it renders differently.
// kInvalidArgument for an unknown name; kNotFound when "auto" finds no known format (the message
// says whether the checkpoint has a template that is not recognised or none at all).
Result<ChatFormat> choose_chat_format(std::string_view configured, const TokenizerConfig& config,
                                      const Tokenizer& tokenizer);

// Per-request switches of the families' templates (the API's `chat_template_kwargs`):
// `thinking` is Qwen3's and GLM-4.5's enable_thinking (false: the assistant turn opens with an
// empty thought, so the model answers at once) and DeepSeek-V3.1's `thinking` (true: the turn
// opens with <think>). Unset: each template's default (Qwen3 and GLM-4.5 think, V3.1 does not);
// families without thinking ignore it.
struct ChatOptions {
    std::optional<bool> thinking;
};

class ChatTemplate {
  public:
    // kNotFound when the tokenizer lacks the format's control tokens. `shipped_template`: the
    // checkpoint's Jinja template ("" when it ships none). ChatML follows Qwen3's thinking rules
    // (empty thoughts, reasoning kept in a tool-calling loop) when the vocabulary has </think>,
    // unless the shipped template never writes a thought (Qwen3-Instruct-2507 has the same
    // vocabulary and no thinking at all).
    static Result<ChatTemplate> create(ChatFormat format, const Tokenizer* tokenizer,
                                       std::string_view shipped_template = {});

    ChatFormat format() const { return format_; }
    // The prompts and replies of this model may hold thoughts (<think> ... </think>).
    bool thinks() const { return thinks_; }

    // Prompt ids for `messages` followed by the assistant turn's opening. kInvalidArgument for
    // no messages, an empty or multi-line role, or text that is not valid UTF-8.
    // `tools` (may be empty) are declared to the model in the family's format; kInvalidArgument
    // for a tool whose parameters are not a JSON object or a GLM-4.5 history tool call whose
    // arguments are not one.
    Result<std::vector<TokenId>> render(std::span<const ChatMessage> messages,
                                        std::span<const ToolSpec> tools = {},
                                        const ChatOptions& options = {}) const;

    // Ids of a forced start of the assistant's reply (GenerateRequest::assistant_prefix), to
    // append after render(): added tokens written in it (control markers) become their ids.
    Result<std::vector<TokenId>> render_assistant_prefix(std::string_view text) const;

    // Ids of the markers this family writes around tool calls that the vocabulary holds as one
    // token. The detokenizer keeps them when tools are offered (Kimi K2's are special tokens).
    std::vector<TokenId> tool_call_marker_ids() const;

    // The same prompt as text (for logs and tests).
    std::string render_text(std::span<const ChatMessage> messages,
                            std::span<const ToolSpec> tools = {},
                            const ChatOptions& options = {}) const;

    // One piece of a prompt: a control marker or plain text.
    struct Piece {
        bool marker = false;
        std::string text;
    };

  private:
    ChatTemplate(ChatFormat format, const Tokenizer* tokenizer, bool thinks)
        : format_(format), tokenizer_(tokenizer), thinks_(thinks) {}
    Result<std::vector<Piece>> pieces(std::span<const ChatMessage> messages,
                                      std::span<const ToolSpec> tools,
                                      const ChatOptions& options) const;

    ChatFormat format_;
    const Tokenizer* tokenizer_;
    bool thinks_ = false;
};

}  // namespace edge::engine::tokenizer
