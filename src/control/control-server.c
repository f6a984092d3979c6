/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: the control socket server (see control-server.h): the
 * socket, its clients and their line framing, and the bound on each
 * client's queued replies.  What a request does is control-handlers.c's.
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <inttypes.h>
#include <unistd.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <ev.h>

#include "control-server.h"
#include "control-protocol.h"
#include "control-handlers.h"
#include "snapfg-log.h"
#include "vector.h"

struct control_server {
  struct snapfg_engine *e;
  char *path;
  int listen_fd;
  struct ev_loop *loop;
  ev_io accept_watcher;
  ev_async stop_watcher;
  pthread_t thread;
  bool started;
  struct client *clients;       /* all open clients, to close at the end */
};

/* --- socket setup --- */

int
control_server_open (struct snapfg_engine *e, const char *path,
                     struct control_server **srvp)
{
  struct sockaddr_un addr = { .sun_family = AF_UNIX };
  struct control_server *srv;
  struct stat st;
  int fd, r;

  if (strlen (path) >= sizeof addr.sun_path) {
    snapfg_error ("control=%s: path too long for a Unix socket", path);
    return -ENAMETOOLONG;
  }
  strcpy (addr.sun_path, path);

  /* Only a stale socket may be replaced: something that is a socket
   * but that nobody answers on.
   */
  if (lstat (path, &st) == 0) {
    int probe;

    if (!S_ISSOCK (st.st_mode)) {
      snapfg_error ("control=%s: exists and is not a socket; refusing to "
                    "replace it", path);
      return -EEXIST;
    }
    probe = socket (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (probe == -1)
      return -errno;
    r = connect (probe, (struct sockaddr *) &addr, sizeof addr);
    close (probe);
    if (r == 0) {
      snapfg_error ("control=%s: a server is already listening on this "
                    "socket", path);
      return -EADDRINUSE;
    }
    if (unlink (path) == -1) {
      snapfg_error ("control=%s: cannot remove the stale socket: %m", path);
      return -errno;
    }
  }

  fd = socket (AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd == -1) {
    r = -errno;
    snapfg_error ("control=%s: socket: %m", path);
    return r;
  }
  if (bind (fd, (struct sockaddr *) &addr, sizeof addr) == -1) {
    r = -errno;
    snapfg_error ("control=%s: bind: %m", path);
    close (fd);
    return r;
  }
  /* Mode 0600 before anyone can connect (connecting needs listen).  A
   * full backlog makes a non-blocking connect fail with EAGAIN: take as
   * many as the system allows, so that a burst of clients is served.
   */
  if (chmod (path, 0600) == -1 || listen (fd, SOMAXCONN) == -1) {
    r = -errno;
    snapfg_error ("control=%s: %m", path);
    close (fd);
    unlink (path);
    return r;
  }

  srv = calloc (1, sizeof *srv);
  if (srv == NULL || (srv->path = strdup (path)) == NULL) {
    free (srv);
    close (fd);
    unlink (path);
    return -ENOMEM;
  }
  srv->e = e;
  srv->listen_fd = fd;
  *srvp = srv;
  return 0;
}

/* --- clients --- */

/* Replies queued for one client before the server stops reading its
 * requests: a client that sends requests and never reads the replies
 * then only fills its socket buffers, not the server's memory.  (One
 * reply is always queued whole, so a client's queue is at most this
 * plus its largest reply.)
 */
#define CONTROL_MAX_QUEUED (256 * 1024)

struct client {
  ev_io io;                     /* first: the callback casts back */
  struct control_server *srv;
  struct client *next, **pprev;
  int fd;
  struct control_peer peer;     /* SO_PEERCRED, for the log */
  int events;                   /* what io watches */
  char in[CONTROL_MAX_LINE + 2];  /* a full line, '\r' or '\n' included */
  size_t in_len;
  bool discarding;              /* skipping the rest of an overlong line */
  bool done_reading;            /* EOF, or a refused client */
  char_vector out;               /* replies not yet written: [out_off, len) */
  size_t out_off;
};

static void client_cb (struct ev_loop *loop, ev_io *w, int revents);

static void
client_close (struct client *c)
{
  ev_io_stop (c->srv->loop, &c->io);
  close (c->fd);
  *c->pprev = c->next;
  if (c->next)
    c->next->pprev = c->pprev;
  char_vector_reset (&c->out);
  free (c);
}

static size_t
queued (const struct client *c)
{
  return c->out.len - c->out_off;
}

/* Queue a reply line (taking it), or an error if it could not be made. */
static void
queue_reply (struct client *c, char *line)
{
  static const char oom[] = "{\"ok\":false,\"error\":\"out of memory\"}\n";
  const char *text = line ? line : oom;
  size_t len = strlen (text);

  if (c->out_off > 0) {         /* keep the queue at the buffer's start */
    memmove (c->out.ptr, c->out.ptr + c->out_off, queued (c));
    c->out.len -= c->out_off;
    c->out_off = 0;
  }
  /* On failure there is nothing sensible to say: the client loses this
   * reply.
   */
  char_vector_append_n (&c->out, text, len);
  free (line);
}

static void
handle_line (struct client *c, const char *line, size_t len)
{
  struct control_request req;
  char err[256];

  if (control_parse_request (line, len, &req, err, sizeof err) < 0) {
    /* The client's mistake, not the server's: a debug message. */
    snapfg_debug ("control: pid %d uid %d: bad request: %s",
                  (int) c->peer.pid, (int) c->peer.uid, err);
    queue_reply (c, control_error_reply (err));
    return;
  }
  queue_reply (c, control_execute (c->srv->e, &req, &c->peer));
  control_request_free (&req);
}

/* Answer the complete lines received so far, while the queue has room. */
static void
process_lines (struct client *c)
{
  char *nl;

  while (queued (c) < CONTROL_MAX_QUEUED) {
    nl = memchr (c->in, '\n', c->in_len);
    if (nl == NULL) {
      if (c->in_len == sizeof c->in) {
        /* No newline within the bound: refuse it and skip to the next. */
        if (!c->discarding) {
          char msg[128];
          snprintf (msg, sizeof msg, "request longer than %d bytes",
                    CONTROL_MAX_LINE);
          snapfg_debug ("control: pid %d uid %d: %s", (int) c->peer.pid,
                        (int) c->peer.uid, msg);
          queue_reply (c, control_error_reply (msg));
        }
        c->discarding = true;
        c->in_len = 0;
      }
      return;
    }
    size_t len = nl - c->in;
    if (c->discarding)
      c->discarding = false;    /* the end of the overlong line */
    else
      handle_line (c, c->in, len > 0 && c->in[len - 1] == '\r'
                   ? len - 1 : len);
    memmove (c->in, nl + 1, c->in_len - len - 1);
    c->in_len -= len + 1;
  }
}

/* Watch what there is to do; close the client when nothing is left.
 * Returns false if c is gone.
 */
static bool
client_update (struct client *c)
{
  int events = 0;

  if (!c->done_reading && queued (c) < CONTROL_MAX_QUEUED)
    events |= EV_READ;
  if (queued (c) > 0)
    events |= EV_WRITE;
  if (events == 0) {
    /* Done reading and every reply delivered (a line cut off by the
     * client's EOF is dropped).
     */
    client_close (c);
    return false;
  }
  if (events != c->events) {
    ev_io_stop (c->srv->loop, &c->io);
    ev_io_set (&c->io, c->fd, events);
    ev_io_start (c->srv->loop, &c->io);
    c->events = events;
  }
  return true;
}

static void
client_read (struct client *c)
{
  ssize_t n = read (c->fd, c->in + c->in_len, sizeof c->in - c->in_len);

  if (n == 0)
    c->done_reading = true;     /* answer what came, then close */
  else if (n == -1) {
    if (errno != EAGAIN && errno != EINTR) {
      client_close (c);
      return;
    }
  }
  else
    c->in_len += n;
  process_lines (c);
  client_update (c);
}

static void
client_write (struct client *c)
{
  while (queued (c) > 0) {
    ssize_t n = write (c->fd, c->out.ptr + c->out_off, queued (c));
    if (n == -1) {
      if (errno == EAGAIN || errno == EINTR)
        break;
      client_close (c);         /* gone; nothing more to say */
      return;
    }
    c->out_off += n;
  }
  if (queued (c) == 0) {
    c->out_off = 0;
    char_vector_clear (&c->out);
    if (c->out.cap > 4 * CONTROL_MAX_QUEUED)
      char_vector_reset (&c->out);  /* a huge reply went out: memory back */
  }
  /* Room again: the requests held back meanwhile. */
  process_lines (c);
  client_update (c);
}

static void
client_cb (struct ev_loop *loop, ev_io *w, int revents)
{
  struct client *c = (struct client *) w;

  if (revents & EV_WRITE) {
    client_write (c);
    return;                     /* c may be gone; reads come next round */
  }
  if (revents & EV_READ)
    client_read (c);
}

static void
accept_one (struct control_server *srv, int fd)
{
  struct ucred cred = { .pid = 0 };
  socklen_t len = sizeof cred;
  struct client *c;

  c = calloc (1, sizeof *c);
  if (c == NULL) {
    close (fd);
    return;
  }
  c->srv = srv;
  c->fd = fd;
  c->next = srv->clients;
  if (c->next)
    c->next->pprev = &c->next;
  c->pprev = &srv->clients;
  srv->clients = c;
  ev_io_init (&c->io, client_cb, fd, 0);

  if (getsockopt (fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == -1 ||
      cred.uid != geteuid ()) {
    snapfg_error ("control=%s: refused a client with uid %d (only uid "
                  "%d may use this socket)", srv->path, (int) cred.uid,
                  (int) geteuid ());
    queue_reply (c, control_error_reply ("permission denied: only the "
                                         "server's owner may use this "
                                         "socket"));
    c->done_reading = true;
  }
  c->peer.pid = cred.pid;
  c->peer.uid = cred.uid;
  client_update (c);
}

static void
accept_cb (struct ev_loop *loop, ev_io *w, int revents)
{
  struct control_server *srv = w->data;

  /* A burst of clients is taken in one go (up to a bound, so that the
   * clients already connected are not starved).
   */
  for (int i = 0; i < 64; ++i) {
    int fd = accept4 (srv->listen_fd, NULL, NULL,
                      SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd == -1)
      return;
    accept_one (srv, fd);
  }
}

static void
stop_cb (struct ev_loop *loop, ev_async *w, int revents)
{
  ev_break (loop, EVBREAK_ALL);
}

static void *
server_thread (void *arg)
{
  struct control_server *srv = arg;

  ev_run (srv->loop, 0);
  while (srv->clients)
    client_close (srv->clients);
  return NULL;
}

int
control_server_start (struct control_server *srv)
{
  int err;

  srv->loop = ev_loop_new (EVFLAG_AUTO);
  if (srv->loop == NULL) {
    snapfg_error ("control=%s: cannot create the event loop", srv->path);
    return -ENOMEM;
  }
  ev_io_init (&srv->accept_watcher, accept_cb, srv->listen_fd, EV_READ);
  srv->accept_watcher.data = srv;
  ev_io_start (srv->loop, &srv->accept_watcher);
  ev_async_init (&srv->stop_watcher, stop_cb);
  ev_async_start (srv->loop, &srv->stop_watcher);

  err = pthread_create (&srv->thread, NULL, server_thread, srv);
  if (err) {
    snapfg_error ("control=%s: cannot start its thread: %s", srv->path,
                  strerror (err));
    ev_loop_destroy (srv->loop);
    srv->loop = NULL;
    return -err;
  }
  srv->started = true;
  return 0;
}

void
control_server_close (struct control_server *srv)
{
  if (srv == NULL)
    return;
  if (srv->started) {
    ev_async_send (srv->loop, &srv->stop_watcher);
    pthread_join (srv->thread, NULL);
  }
  if (srv->loop)
    ev_loop_destroy (srv->loop);
  close (srv->listen_fd);
  unlink (srv->path);
  free (srv->path);
  free (srv);
}
