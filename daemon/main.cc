// edgeserve: one binary, subcommands dispatched from a table. Other folders add a row here with
// their `int xxx_main(int argc, char** argv)` (generate, make-model, quantize, quant-eval,
// members, pools, route).

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "daemon/cluster/cli.h"
#include "daemon/commands.h"
#include "engine/tools/generate.h"
#include "engine/tools/make_model.h"
#include "engine/tools/quant_eval.h"
#include "engine/tools/quantize.h"

namespace {

struct Command {
    const char* name;
    int (*main)(int argc, char** argv);
    const char* help;
};

constexpr Command kCommands[] = {
    {"run", edge::daemon::run_main, "run --config FILE      serve (until SIGTERM)"},
    {"check-config", edge::daemon::check_config_main,
     "check-config [--no-files] [--socket-activated] FILE\n"
     "         validate a config file and the files it names"},
    {"generate", edge::engine::generate_main,
     "generate --model DIR (--prompt TEXT | --prompt-ids 1,2,3) [--max-tokens N]\n"
     "         [--temperature T] [--seed N] [--threads N] [--ids] [--chat]   run a checkpoint "
     "without the daemon"},
    {"make-model", edge::engine::make_model_main,
     "make-model [--arch qwen3_moe|glm4_moe|deepseek_v3] --preset tiny|bench --out DIR "
     "[--seed N] [--force]   write a random MoE checkpoint"},
    {"quantize", edge::engine::quantize_main,
     "quantize --model IN --policy P --out DIR [--shard-size 5GB] [--threads N] [--force]\n"
     "         write a quantized checkpoint (FP8/INT8/INT4)"},
    {"quant-eval", edge::engine::quant_eval_main,
     "quant-eval --model DIR --policies P1,P2 [--text FILE] [--tokens N] [--chunk N]\n"
     "         [--threads N] [--no-per-class]   quality table"},
    {"members", edge::daemon::cluster::members_main,
     "members [--admin HOST:PORT] [--json]   gossip members of the cluster"},
    {"pools", edge::daemon::cluster::pools_main,
     "pools [--admin HOST:PORT] [--json]     every model pool in the cluster, with load"},
    {"route", edge::daemon::cluster::route_main,
     "route --model M [--version V] [--admin HOST:PORT] [--json]   where M would run, and why"},
    {"rollout", edge::daemon::cluster::rollout_main,
     "rollout --model M --version DIGEST [--admin HOST:PORT]   set the cluster's target version"},
    // Each of the four also takes --token-file FILE (a site with listeners.admin.token_file).
};

void usage(FILE* out) {
    std::fprintf(out, "usage: edgeserve COMMAND [ARGS]\n\ncommands:\n");
    for (const Command& c : kCommands) {
        std::fprintf(out, "  %s\n", c.help);
    }
    std::fprintf(
        out,
        "  (members, pools, route, rollout: --token-file FILE where the site has an "
        "admin token)\n"
        "  --version              print the version\n  --help                 this text\n"
        "  help COMMAND           COMMAND's usage (as COMMAND --help)\n");
}

// The exit status once what the command printed has reached stdout: output lost to a full disk
// (or /dev/full) is a failure, as it is for git and coreutils, never a silent 0.
int flushed(int status) {
    const int err = std::fflush(stdout) != 0 ? errno : 0;
    if (err != 0 || std::ferror(stdout)) {
        std::fprintf(stderr, "edgeserve: cannot write to standard output%s%s\n",
                     err != 0 ? ": " : "", err != 0 ? std::strerror(err) : "");
        return status == 0 ? 1 : status;
    }
    return status;
}

int dispatch(int argc, char** argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (std::strcmp(argv[1], "--version") == 0) {
        std::printf("edgeserve %s\n", EDGE_VERSION);
        return 0;
    }
    const bool help = std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0 ||
                      std::strcmp(argv[1], "help") == 0;
    if (help && argc == 2) {
        usage(stdout);
        return 0;
    }
    // `edgeserve help COMMAND` is `edgeserve COMMAND --help`, as git has it.
    const char* name = help ? argv[2] : argv[1];
    for (const Command& c : kCommands) {
        if (std::strcmp(name, c.name) == 0) {
            if (help) {
                char help_flag[] = "--help";
                char* help_argv[] = {argv[2], help_flag, nullptr};
                return c.main(2, help_argv);
            }
            return c.main(argc - 1, argv + 1);
        }
    }
    std::fprintf(stderr, "edgeserve: unknown command '%s'\n\n", name);
    usage(stderr);
    return 2;
}

}  // namespace

int main(int argc, char** argv) { return flushed(dispatch(argc, argv)); }
