/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfgctl: inspect and control snapfg (see snapfgctl(1)).
 *
 *   snapfgctl [-S SOCKET] [--json] COMMAND [ARGS] [OPTIONS]
 *
 * sends one request to a running server's control socket (control=) and
 * prints the reply; "inspect COW" reads a COW store on disk instead.
 * The commands, their arguments and options, and the usage text all
 * come from the table in control-commands.def.  Options may come
 * anywhere on the line (GNU style): "status --json" is "--json status".
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <inttypes.h>
#include <unistd.h>
#include <time.h>
#include <signal.h>

#include <jansson.h>

#include "control-commands.h"
#include "snapfgctl.h"
#include "tool-output.h"

/* The rest of snapfgctl: see snapfgctl.h for which file holds what. */

/* merge --wait: poll status until the snapshot is gone (merged), with a
 * progress report as --progress says (tools/common/tool-output.c).
 */
static int
wait_for_merge (struct control_client *cn, const char *name, bool quiet)
{
  json_t *req = control_request (CONTROL_STATUS), *reply = NULL, *sn;
  struct tool_progress prog;
  uint64_t done = 0, total = 0;
  const char *state = "";
  char what[300];
  int status;

  if (req == NULL)
    return EXIT_REFUSED;
  control_request_set_string (req, "name", name);
  snprintf (what, sizeof what, "merging %s", name);
  if (!quiet)
    tool_progress_start_count (&prog, what, "chunks");
  for (;;) {
    reply = control_client_call (cn, req, NULL);
    if (reply == NULL)
      break;
    sn = json_array_get (json_object_get (reply, "snapshots"), 0);
    state = get_str (sn, "state");
    /* Gone from the list (status refuses the name), or the merge ended
     * between our request and the reply: the merge is done.
     */
    if (!json_is_true (json_object_get (reply, "ok")))
      state = "merged";
    if (strcmp (state, "merging") != 0)
      break;
    done = get_u64 (sn, "merge_done");
    total = get_u64 (sn, "merge_total");
    if (!quiet)
      tool_progress_update (&prog, done, total);
    json_decref (reply);
    nanosleep (&(struct timespec) { .tv_nsec = 200 * 1000 * 1000 }, NULL);
  }
  if (reply && strcmp (state, "merged") == 0)
    done = total;
  if (!quiet)
    tool_progress_end (&prog, done, total);
  if (reply == NULL) {
    tool_error ("merge --wait: %s", cn->error);
    status = control_client_exit_status (cn);
  }
  else if (strcmp (state, "merged") == 0) {
    if (!quiet)
      printf ("merged snapshot %s into the origin\n", name);
    status = EXIT_OK;
  }
  else {
    tool_error ("merge of %s stopped: the snapshot is %s (%s)", name, state,
                get_str (json_array_get (json_object_get (reply,
                                                          "snapshots"), 0),
                         "status"));
    status = EXIT_REFUSED;
  }
  json_decref (reply);
  json_decref (req);
  return status;
}

static int
run_command (const struct cmdline *cl, const struct control_command *c)
{
  json_t *req, *reply, *status_reply = NULL;
  bool prometheus = c->cmd == CONTROL_STATS &&
    option_value (cl, "prometheus") != NULL;
  struct control_client cn;
  char *line = NULL;
  int st;

  req = build_request (cl, c);
  if (req == NULL)
    return EXIT_USAGE;
  if (cl->socket_path == NULL) {
    tool_error ("%s: give the server's control socket with "
                "-S SOCKET", cli_name (c));
    json_decref (req);
    return EXIT_USAGE;
  }
  if (prometheus && cl->json_output) {
    tool_error ("stats: --json and --prometheus exclude "
                "each other");
    json_decref (req);
    return EXIT_USAGE;
  }
  if (control_client_connect (&cn, cl->socket_path, cl->timeout) < 0) {
    tool_error ("%s", cn.error);
    json_decref (req);
    control_client_close (&cn);
    return EXIT_UNREACHABLE;
  }
  reply = control_client_call (&cn, req, &line);
  if (reply == NULL) {
    tool_error ("%s", cn.error);
    st = control_client_exit_status (&cn);
    json_decref (req);
    control_client_close (&cn);
    return st;
  }
  if (!json_is_true (json_object_get (reply, "ok"))) {
    if (cl->json_output) {
      puts (line);
      tool_out.result_printed = true;
    }
    tool_error ("%s", control_reply_error (reply));
    st = EXIT_REFUSED;
    goto out;
  }
  st = EXIT_OK;
  if (prometheus) {
    /* The COW usage and states come from status, on the same connection. */
    json_t *sreq = control_request (CONTROL_STATUS);
    status_reply = sreq ? control_client_call (&cn, sreq, NULL) : NULL;
    json_decref (sreq);
    if (status_reply == NULL) {
      tool_error ("%s", cn.error);
      st = control_client_exit_status (&cn);
      goto out;
    }
    snapfgctl_print_prometheus (reply, status_reply);
  }
  else if (cl->json_output) {
    puts (line);
    tool_out.result_printed = true;
  }
  else
    print_human (c, cl, req, reply);
  if (c->cmd == CONTROL_MERGE && option_value (cl, "wait")) {
    fflush (stdout);
    st = wait_for_merge (&cn, get_str (req, "name"), cl->json_output);
  }

 out:
  if (fflush (stdout) == EOF && st == EXIT_OK) {
    tool_error ("writing the output: %m");
    st = EXIT_REFUSED;
  }
  json_decref (status_reply);
  json_decref (reply);
  json_decref (req);
  free (line);
  control_client_close (&cn);
  return st;
}

/* Run what the command line asks for. */
static int
dispatch (struct cmdline cl)
{
  const struct control_command *c;
  const char *cmd;
  size_t used;

  if (cl.version) {
    if (cl.json_output)
      tool_json_result (json_pack ("{s:s, s:s}", "command", "version",
                                   "version", PACKAGE_VERSION), 0);
    else
      printf ("snapfgctl %s\n", PACKAGE_VERSION);
    return EXIT_OK;
  }
  if (cl.stdio) {
    if (cl.nwords || cl.socket_path == NULL) {
      tool_error ("usage: snapfgctl --stdio "
                  "[--drop-on-hangup] [--timeout SECONDS] -S SOCKET (no "
                  "command: the requests come on standard input)");
      return EXIT_USAGE;
    }
    return snapfgctl_stdio (cl.socket_path, cl.timeout, cl.drop_on_hangup);
  }
  if (cl.drop_on_hangup) {
    tool_error ("--drop-on-hangup is an option of --stdio");
    return EXIT_USAGE;
  }
  if (cl.nwords == 0) {
    usage (cl.help ? stdout : stderr);
    return cl.help ? EXIT_OK : EXIT_USAGE;
  }

  if (strcmp (cl.words[0], "help") == 0) {
    /* help [COMMAND] is COMMAND --help. */
    if (cl.nwords == 1) {
      if (cl.help)
        help_help (stdout);     /* help --help */
      else
        usage (stdout);
      return EXIT_OK;
    }
    cl.words++;
    cl.nwords--;
    cl.help = true;
    if (strcmp (cl.words[0], "help") == 0 && cl.nwords == 1) {
      help_help (stdout);       /* help help */
      return EXIT_OK;
    }
  }
  cmd = cl.words[0];
  if (strcmp (cmd, "inspect") == 0) {
    if (cl.help) {
      inspect_help (stdout);
      return EXIT_OK;
    }
    for (size_t i = 0; i < cl.nopts; ++i)
      if (cl.opts[i].value) {
        tool_error ("inspect does not take --%s",
                    cl.opts[i].name);
        return EXIT_USAGE;
      }
    if (cl.nwords != 2) {
      inspect_help (stderr);
      return EXIT_USAGE;
    }
    /* Its --json output is its own, whatever the result. */
    tool_out.result_printed = true;
    return snapfgctl_inspect (cl.words[1], cl.exceptions, cl.json_output);
  }
  c = find_command (cl.words, cl.nwords, &used);
  if (c == NULL) {
    tool_error ("unknown command '%s' (see snapfgctl "
                "help)", cmd);
    return EXIT_USAGE;
  }
  /* The command's arguments follow its one or two words. */
  cl.words += used - 1;
  cl.nwords -= used - 1;
  if (cl.help) {
    command_help (stdout, c);
    return EXIT_OK;
  }
  return run_command (&cl, c);
}

int
main (int argc, char *argv[])
{
  struct cmdline cl = { .socket_path = NULL,
                        .timeout = TOOL_DEFAULT_TIMEOUT };
  int st;

  tool_out.prog = "snapfgctl";
  signal (SIGPIPE, SIG_IGN);

  if (parse_cmdline (argc, argv, &cl) < 0) {
    fprintf (stderr, "Try 'snapfgctl help'.\n");
    st = EXIT_USAGE;
  }
  else {
    tool_out.json = cl.json_output;
    st = dispatch (cl);         /* a copy: it may move cl.words */
  }
  /* With --json, stdout holds a JSON object whatever happened: a
   * failure before any reply is said there too.
   */
  if (cl.json_output && st != EXIT_OK && st != EXIT_USAGE &&
      !tool_out.result_printed)
    tool_json_result (NULL, st);
  free (cl.words);
  free (cl.opts);
  return st;
}
