/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* The control client of both tools: see control-client.h.
 *
 * What was read past a reply's newline is kept for the next reply.
 * Replies can be long (a "changed" reply lists every range), so a reply
 * is read until its newline, however long; the timeout applies to the
 * wait for each piece of it, so that a server that accepts but never
 * answers (or stops halfway) cannot hang the tool.
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>

#include "cleanup.h"
#include "control-client.h"
#include "tool-exit.h"

static void
client_init (struct control_client *c, int timeout_s)
{
  memset (c, 0, sizeof *c);
  c->rfd = c->wfd = -1;
  c->pid = -1;
  c->timeout_ms = timeout_s > 0 ? timeout_s * 1000 : -1;
  c->result = CONTROL_UNREACHABLE;
}

#define SAY(c, result_, ...) do {                               \
    (c)->result = (result_);                                    \
    snprintf ((c)->error, sizeof (c)->error, __VA_ARGS__);      \
  } while (0)

int
control_client_connect (struct control_client *c, const char *path,
                        int timeout_s)
{
  struct sockaddr_un addr = { .sun_family = AF_UNIX };
  int fd;

  client_init (c, timeout_s);
  if (asprintf (&c->what, "the control socket %s", path) == -1) {
    c->what = NULL;
    SAY (c, CONTROL_UNREACHABLE, "out of memory");
    return -1;
  }
  if (strlen (path) >= sizeof addr.sun_path) {
    SAY (c, CONTROL_UNREACHABLE, "%s: control socket path too long", path);
    goto fail;
  }
  strcpy (addr.sun_path, path);
  fd = socket (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd == -1 || connect (fd, (struct sockaddr *) &addr, sizeof addr) == -1) {
    SAY (c, CONTROL_UNREACHABLE, "cannot connect to the control socket %s: "
         "%s (is the server running with control=%s?)", path,
         strerror (errno), path);
    if (fd >= 0)
      close (fd);
    goto fail;
  }
  c->rfd = c->wfd = fd;
  c->result = CONTROL_REPLIED;
  return 0;

 fail:
  /* A client that failed to open holds nothing, so that a caller that
   * only prints c->error and returns leaks nothing (closing it anyway
   * is harmless).
   */
  free (c->what);
  c->what = NULL;
  return -1;
}

int
control_client_spawn (struct control_client *c, char *const argv[],
                      const char *what, int timeout_s)
{
  int in[2] = { -1, -1 }, out[2] = { -1, -1 };
  pid_t parent = getpid ();

  client_init (c, timeout_s);
  c->what = strdup (what);
  if (pipe2 (in, O_CLOEXEC) == -1 || pipe2 (out, O_CLOEXEC) == -1) {
    SAY (c, CONTROL_UNREACHABLE, "pipe: %s", strerror (errno));
    goto fail;
  }
  fflush (stderr);
  c->pid = fork ();
  if (c->pid == -1) {
    SAY (c, CONTROL_UNREACHABLE, "fork: %s", strerror (errno));
    goto fail;
  }
  if (c->pid == 0) {
    /* Its own process group: ^C on the terminal interrupts us, and we
     * still need the connection to drop the run's snapshot.
     */
    setpgid (0, 0);
    prctl (PR_SET_PDEATHSIG, SIGTERM);
    if (getppid () != parent)
      _exit (127);
    signal (SIGPIPE, SIG_DFL);
    if (dup2 (in[0], 0) == -1 || dup2 (out[1], 1) == -1)
      _exit (127);
    execvp (argv[0], argv);
    fprintf (stderr, "cannot run %s: %s\n", argv[0], strerror (errno));
    _exit (127);
  }
  close (in[0]);
  close (out[1]);
  c->wfd = in[1];
  c->rfd = out[0];
  c->result = CONTROL_REPLIED;
  return 0;

 fail:
  for (int i = 0; i < 2; ++i) {
    if (in[i] >= 0)
      close (in[i]);
    if (out[i] >= 0)
      close (out[i]);
  }
  free (c->what);               /* as in control_client_connect */
  c->what = NULL;
  return -1;
}

/* Wait for the command to exit, at most MS milliseconds. */
static bool
reap (pid_t pid, int ms)
{
  for (int waited = 0; ; waited += 20) {
    pid_t r = waitpid (pid, NULL, WNOHANG);
    if (r == pid || (r == -1 && errno != EINTR))
      return true;
    if (waited >= ms)
      return false;
    nanosleep (&(struct timespec) { .tv_nsec = 20 * 1000 * 1000 }, NULL);
  }
}

void
control_client_close (struct control_client *c)
{
  if (c->wfd >= 0 && c->wfd != c->rfd)
    close (c->wfd);
  if (c->rfd >= 0)
    close (c->rfd);
  c->rfd = c->wfd = -1;
  /* Its standard input closed, the command ends (ssh: once the remote
   * side has); one that does not is ended.
   */
  if (c->pid > 0 && !reap (c->pid, 5000)) {
    kill (c->pid, SIGTERM);
    if (!reap (c->pid, 2000)) {
      kill (c->pid, SIGKILL);
      reap (c->pid, 2000);
    }
  }
  c->pid = -1;
  char_vector_reset (&c->buf);
  free (c->what);
  c->what = NULL;
}

/* Wait until FD is ready for EVENTS, at most the client's timeout.
 * 0, or -1 with the result set.
 */
static int
wait_fd (struct control_client *c, int fd, short events, const char *doing)
{
  struct pollfd p = { .fd = fd, .events = events };

  for (;;) {
    int r = poll (&p, 1, c->timeout_ms);
    if (r == -1 && errno == EINTR)
      continue;
    if (r == -1) {
      SAY (c, CONTROL_UNREACHABLE, "poll: %s", strerror (errno));
      return -1;
    }
    if (r == 0) {
      SAY (c, CONTROL_TIMEOUT, "%s: no reply within %d s while %s (the "
           "server accepted the connection but does not answer; "
           "--timeout sets the limit)", c->what, c->timeout_ms / 1000,
           doing);
      return -1;
    }
    return 0;
  }
}

static int
send_all (struct control_client *c, const char *p, size_t len)
{
  while (len > 0) {
    ssize_t n;

    if (wait_fd (c, c->wfd, POLLOUT, "sending a request") == -1)
      return -1;
    n = write (c->wfd, p, len);
    if (n == -1 && (errno == EINTR || errno == EAGAIN))
      continue;
    if (n == -1) {
      SAY (c, CONTROL_UNREACHABLE, "writing to %s: %s", c->what,
           errno == EPIPE ? "the connection was closed" : strerror (errno));
      return -1;
    }
    p += n;
    len -= n;
  }
  return 0;
}

int
control_client_send (struct control_client *c, json_t *req)
{
  CLEANUP_FREE char *text = NULL;
  size_t len;

  if (c->rfd < 0) {
    if (c->result == CONTROL_REPLIED)
      SAY (c, CONTROL_UNREACHABLE, "not connected");
    return -1;
  }
  text = json_dumps (req, JSON_COMPACT);
  if (text == NULL) {
    SAY (c, CONTROL_BAD_REPLY, "out of memory");
    return -1;
  }
  len = strlen (text);
  text[len] = '\n';             /* json_dumps's NUL becomes the newline */
  return send_all (c, text, len + 1);
}

json_t *
control_client_receive (struct control_client *c, const char *cmd,
                        char **line)
{
  size_t len;
  char *nl;
  json_error_t jerr;
  json_t *reply;

  if (line)
    *line = NULL;
  if (c->rfd < 0) {
    if (c->result == CONTROL_REPLIED)
      SAY (c, CONTROL_UNREACHABLE, "not connected");
    return NULL;
  }
  while ((nl = c->buf.len ? memchr (c->buf.ptr, '\n', c->buf.len) : NULL)
         == NULL) {
    ssize_t n;

    if (char_vector_reserve (&c->buf, 4096) < 0) {
      SAY (c, CONTROL_BAD_REPLY, "out of memory reading the reply");
      return NULL;
    }
    if (wait_fd (c, c->rfd, POLLIN, cmd ? cmd : "reading a reply") == -1)
      return NULL;
    n = read (c->rfd, c->buf.ptr + c->buf.len, c->buf.cap - c->buf.len);
    if (n == -1 && (errno == EINTR || errno == EAGAIN))
      continue;
    if (n <= 0) {
      SAY (c, CONTROL_UNREACHABLE, "no reply from %s to \"%s\"%s%s",
           c->what, cmd ? cmd : "?",
           n < 0 ? ": " : " (the connection was closed)",
           n < 0 ? strerror (errno) : "");
      return NULL;
    }
    c->buf.len += n;
  }
  len = nl - c->buf.ptr;
  reply = json_loadb (c->buf.ptr, len, JSON_REJECT_DUPLICATES, &jerr);
  if (reply == NULL || !json_is_object (reply) ||
      !json_is_boolean (json_object_get (reply, "ok"))) {
    SAY (c, CONTROL_BAD_REPLY, "unreadable reply from %s to \"%s\": %s",
         c->what, cmd ? cmd : "?",
         reply ? "not an object with \"ok\"" : jerr.text);
    json_decref (reply);
    return NULL;
  }
  if (line) {
    *line = strndup (c->buf.ptr, len);
    if (*line == NULL) {
      SAY (c, CONTROL_BAD_REPLY, "out of memory");
      json_decref (reply);
      return NULL;
    }
  }
  memmove (c->buf.ptr, nl + 1, c->buf.len - len - 1);
  c->buf.len -= len + 1;
  c->result = CONTROL_REPLIED;
  return reply;
}

json_t *
control_client_call (struct control_client *c, json_t *req, char **line)
{
  if (line)
    *line = NULL;
  if (control_client_send (c, req) == -1)
    return NULL;
  return control_client_receive (c, json_string_value (json_object_get
                                                       (req, "cmd")), line);
}

const char *
control_reply_error (json_t *reply)
{
  const char *msg = json_string_value (json_object_get (reply, "error"));

  return msg ? msg : "the server refused the request";
}

int
control_client_exit_status (const struct control_client *c)
{
  switch (c->result) {
  case CONTROL_UNREACHABLE:
  case CONTROL_BAD_REPLY:       /* not a snapfg control socket */
    return TOOL_EXIT_UNREACHABLE;
  case CONTROL_TIMEOUT: return TOOL_EXIT_TIMEOUT;
  default: return TOOL_EXIT_FAILED;
  }
}

/* --- requests from the command table --- */

json_t *
control_request (enum control_cmd cmd)
{
  if ((unsigned) cmd >= CONTROL_NCOMMANDS)
    abort ();
  return json_pack ("{s:s}", "cmd", control_commands[cmd].name);
}

void
control_request_set (json_t *req, const char *key, json_t *value)
{
  const char *name = json_string_value (json_object_get (req, "cmd"));
  const struct control_command *cmd = name ? control_command_find (name)
    : NULL;
  const struct control_arg *a = cmd ? control_arg_find (cmd->cmd, key) : NULL;
  bool typed;

  if (value == NULL)
    return;
  if (a == NULL || (a->flags & CONTROL_ARG_LOCAL)) {
    fprintf (stderr, "internal error: the control command \"%s\" has no "
             "key \"%s\" (control-commands.def)\n", name ? name : "?", key);
    abort ();
  }
  switch (a->type) {
  case CONTROL_TYPE_SIZE: typed = json_is_integer (value); break;
  case CONTROL_TYPE_BOOL: typed = json_is_boolean (value); break;
  default: typed = json_is_string (value); break;
  }
  if (!typed) {
    fprintf (stderr, "internal error: the control key \"%s\" of \"%s\" has "
             "another type (control-commands.def)\n", key, name);
    abort ();
  }
  json_object_set_new (req, key, value);
}
