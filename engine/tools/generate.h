#pragma once

// `edgeserve generate`: runs the engine in-process on one checkpoint directory, without the
// daemon, and prints the generated text as it streams (or, with --ids, the generated token ids,
// comma-separated, on one line). For checking a checkpoint from the command line:
//
//   edgeserve generate --model DIR (--prompt TEXT | --prompt-ids 1,2,3) [--max-tokens N]
//                      [--temperature T] [--seed N] [--ids] [--chat] [--threads N]
//
// --chat sends TEXT as one user message through the model's chat template. The default
// temperature is 0 (greedy). Returns 0 on success, 2 for bad arguments, 1 for engine errors
// (printed on stderr). Runs on the calling thread and blocks until generation ends.

namespace edge::engine {

int generate_main(int argc, char** argv);

}  // namespace edge::engine
