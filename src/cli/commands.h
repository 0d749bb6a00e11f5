// The subcommands of the `megatron` binary. Each takes the arguments after its name and
// returns the process exit status; user errors propagate as UserError to main().
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace megatron {
struct ModelFamily;
}

namespace megatron::cli {

using Args = std::vector<std::string>;

int train(const Args& args);
// `train` and `convert` for a model of `family`, a record of the calling program's own (a
// program that links megatron_cli and adds a family; tests/custom_family does).
int train_as(const ModelFamily& family, const Args& args);
int convert_as(const ModelFamily& family, const Args& args);
int eval(const Args& args);       // a checkpoint's validation / test loss; with --task, eval_task
int eval_task(const Args& args);  // benchmark scores by lm-evaluation-harness's rules (eval_task_command.cpp)
int generate(const Args& args);
int serve(const Args& args);  // the OpenAI API over HTTP
int convert(const Args& args);
int preprocess(const Args& args);
int version(const Args& args);
int plan_layouts(const Args& args);  // `megatron plan`: parallel layouts of a model on a cluster
int launch(const Args& args);
// Around a program's subcommand (report_errors.cpp): SIGPIPE ignored (a peer gone is an error to
// report, not a signal to die of), stdout line-buffered and a heartbeat
// (distributed/heartbeat.h) when `megatron launch` started this process, and run() with user
// errors printed as "error: ..." (exit status 2), a failed collective with a peer as "error: ..."
// (1), and internal ones as "internal error: ..." (1).
void set_up_under_launch();
int run_reporting_errors(const std::function<int()>& run);
// Hidden (not in the help): prints the parsed LaunchEnv and misbehaves on request, for tests.
int print_env(const Args& args);

}  // namespace megatron::cli
