#include "daemon/api/api_error.h"

#include <algorithm>
#include <boost/json.hpp>
#include <cctype>
#include <string_view>

#include "common/json_text.h"
#include "common/log.h"

namespace edge::daemon::api {

std::string ApiError::to_json() const {
    boost::json::object error;
    error["message"] = message;
    error["type"] = type;
    error["param"] = param ? boost::json::value(*param) : boost::json::value(nullptr);
    error["code"] = code ? boost::json::value(*code) : boost::json::value(nullptr);
    boost::json::object root;
    root["error"] = std::move(error);
    return json_text(root);
}

tls::HttpResponse ApiError::to_response() const {
    tls::HttpResponse r;
    r.status = status;
    r.body = to_json();
    if (retry_after_seconds > 0) {
        r.headers.push_back({"Retry-After", std::to_string(retry_after_seconds)});
    }
    if (!www_authenticate.empty()) {
        r.headers.push_back({"WWW-Authenticate", www_authenticate});
    }
    return r;
}

ApiError invalid_request(std::string message, std::optional<std::string> param) {
    ApiError e;
    e.status = 400;
    e.message = std::move(message);
    e.param = std::move(param);
    return e;
}

ApiError model_not_found(const std::string& model) {
    ApiError e;
    e.status = 404;
    e.message = "The model '" + model + "' does not exist or you do not have access to it.";
    e.param = "model";
    e.code = "model_not_found";
    return e;
}

namespace {

// A 400 whose `param` is the field the engine names first: "max_tokens: ..." or "prompt[3]: ...",
// as the API layer spells its own ("messages[0].role").
ApiError bad_field(const std::string& m) {
    ApiError e;
    e.status = 400;
    e.message = m;
    std::string_view head(m);
    if (head.rfind("param ", 0) == 0) {
        head.remove_prefix(6);
    }
    size_t colon = head.find(": ");
    if (colon != std::string_view::npos && colon > 0) {
        std::string_view field = head.substr(0, colon);
        bool is_field = std::all_of(field.begin(), field.end(), [](char c) {
            return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' ||
                   c == '[' || c == ']';
        });
        if (is_field && !std::isdigit(static_cast<unsigned char>(field[0]))) {
            e.param = std::string(field);
            e.message = std::string(head);
        }
    }
    return e;
}

}  // namespace

ApiError api_error_from_status(const Status& status, const std::string& model) {
    ApiError e;
    switch (status.code()) {
        case StatusCode::kNotFound:
            return model_not_found(model);
        case StatusCode::kInvalidArgument:
            return bad_field(status.message());
        case StatusCode::kOutOfRange:
            // The prompt and max_tokens do not fit the context: OpenAI's code, which clients
            // key on to shorten the conversation.
            e = bad_field(status.message());
            e.code = "context_length_exceeded";
            return e;
        case StatusCode::kResourceExhausted:
            e.status = 429;
            e.type = "rate_limit_error";
            e.code = "rate_limit_exceeded";
            e.message = status.message();
            e.retry_after_seconds = 1;
            return e;
        case StatusCode::kUnavailable:
            e.status = 503;
            e.type = "server_error";
            e.code = "service_unavailable";
            e.message = status.message();
            e.retry_after_seconds = 1;
            return e;
        default:
            // The cause stays out of the answer (it may name files and internals) but goes to
            // the log, where an operator looks for it.
            log::error("internal_error", {{"model", model},
                                          {"code", std::string(status_code_name(status.code()))},
                                          {"message", status.message()}});
            e.status = 500;
            e.type = "server_error";
            e.message = "internal error";
            return e;
    }
}

}  // namespace edge::daemon::api
