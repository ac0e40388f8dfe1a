/* The mxtrain command line: one function per subcommand, each returning the process exit
 * status (0 ok, 1 failure, 2 usage error). */
#ifndef MXT_CLI_H
#define MXT_CLI_H

int cli_demo(int argc, char **argv);
int cli_prepare(int argc, char **argv);
int cli_train(int argc, char **argv);
int cli_init(int argc, char **argv);
int cli_grads(int argc, char **argv);
int cli_plan(int argc, char **argv);
int cli_export(int argc, char **argv);
int cli_plot(int argc, char **argv);
int cli_generate(int argc, char **argv);

/* Parse a positive integer option value; on failure print "mxtrain CMD: --NAME: ..." and
 * return 0 so the caller exits with status 2. */
int cli_parse_positive(const char *cmd, const char *name, const char *text, long long max, long long *out);

/* Whether the output path out (option opt, "--out") is none of the command's n inputs;
 * else prints "mxtrain CMD: --out: 'OUT' is the input 'IN' (...)" and returns 0, and the
 * caller exits with status 2 (the output would replace what it is made from). */
int cli_out_not_input(const char *cmd, const char *opt, const char *out, const char *const *inputs, int n);

#endif
