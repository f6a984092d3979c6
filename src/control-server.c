/* snapfg: the control socket server (see control-server.h). */

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
#include "device.h"
#include "json.h"
#include "snapfg-log.h"

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

struct client {
  ev_io io;                     /* first: the callback casts back */
  struct control_server *srv;
  struct client *next, **pprev;
  int fd;
  char in[CONTROL_MAX_LINE + 2];  /* a full line, '\r' or '\n' included */
  size_t in_len;
  bool discarding;              /* skipping the rest of an overlong line */
  struct json_buf out;
  size_t out_off;
  bool close_after_write;
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
  /* Mode 0600 before anyone can connect (connecting needs listen). */
  if (chmod (path, 0600) == -1 || listen (fd, 16) == -1) {
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

/* --- replies --- */

static void
reply_error (struct json_buf *out, const char *msg)
{
  json_raw (out, "{\"ok\":false,\"error\":");
  json_string (out, msg);
  json_raw (out, "}\n");
}

static void
append_snapshot (struct json_buf *out, struct snapfg_snapshot *s)
{
  struct snapfg_snapshot_info info;

  snapfg_snapshot_info (s, &info);
  json_raw (out, "{");
  json_key (out, "name", true);
  json_string (out, info.name);
  json_key (out, "export", false);
  json_string (out, info.name);
  json_key (out, "state", false);
  json_string (out, info.state);
  json_key (out, "status", false);
  json_string (out, info.status);
  json_key (out, "store", false);
  json_string (out, info.store);
  json_key (out, "cow", false);
  json_string (out, info.cow_path);
  json_key (out, "chunk_size", false);
  json_printf (out, "%" PRIu32, info.chunk_size);
  json_key (out, "exceptions", false);
  json_printf (out, "%" PRIu64, info.exceptions);
  json_key (out, "connections", false);
  json_printf (out, "%d", info.connections);
  if (info.merge_total) {
    json_key (out, "merge_done", false);
    json_printf (out, "%" PRIu64, info.merge_done);
    json_key (out, "merge_total", false);
    json_printf (out, "%" PRIu64, info.merge_total);
  }
  json_raw (out, "}");
}

static void
do_status (struct control_server *srv, const struct control_request *req,
           struct json_buf *out)
{
  struct snapfg_engine *e = srv->e;
  struct snapfg_view_stats vs;
  struct snapfg_snapshot *s;
  bool first = true;

  if (req->name) {
    s = snapfg_snapshot_get (e, req->name);
    if (s == NULL) {
      char msg[256];
      snprintf (msg, sizeof msg, "status: no snapshot named \"%s\"",
                req->name);
      reply_error (out, msg);
      return;
    }
    json_raw (out, "{\"ok\":true,\"snapshots\":[");
    append_snapshot (out, s);
    json_raw (out, "]}\n");
    snapfg_snapshot_put (s);
    return;
  }

  snapfg_view_stats (e, NULL, &vs);
  json_raw (out, "{\"ok\":true,\"origin\":{");
  json_key (out, "export", true);
  json_string (out, "origin");
  json_key (out, "path", false);
  json_string (out, snapfg_origin_path (e));
  json_key (out, "size", false);
  json_printf (out, "%" PRIu64, snapfg_size (e));
  json_key (out, "block_size", false);
  json_printf (out, "%" PRIu32, snapfg_block_size (e));
  json_key (out, "connections", false);
  json_printf (out, "%d", vs.requests.connections);
  json_raw (out, "},\"snapshots\":[");
  for (size_t i = 0; (s = snapfg_snapshot_get_nth (e, i)) != NULL; ++i) {
    if (!first)
      json_raw (out, ",");
    first = false;
    append_snapshot (out, s);
    snapfg_snapshot_put (s);
  }
  json_raw (out, "]}\n");
}

static void
append_stats (struct json_buf *out, const char *name,
              const struct snapfg_view_stats *vs)
{
  const uint64_t *c = vs->requests.counter;

  json_raw (out, "{");
  json_key (out, "export", true);
  json_string (out, name);
  json_key (out, "connections", false);
  json_printf (out, "%d", vs->requests.connections);
  json_key (out, "requests", false);
  json_printf (out, "%" PRIu64, c[STAT_REQUESTS]);
  json_key (out, "errors", false);
  json_printf (out, "%" PRIu64, c[STAT_ERRORS]);
  json_key (out, "bytes_read", false);
  json_printf (out, "%" PRIu64, c[STAT_BYTES_READ]);
  json_key (out, "bytes_written", false);
  json_printf (out, "%" PRIu64, c[STAT_BYTES_WRITTEN]);
  json_key (out, "copy_outs", false);
  json_printf (out, "%" PRIu64, c[STAT_COPY_OUTS]);
  json_key (out, "bytes_copied", false);
  json_printf (out, "%" PRIu64, c[STAT_BYTES_COPIED]);
  json_key (out, "exceptions", false);
  json_printf (out, "%" PRIu64, vs->exceptions);
  json_key (out, "pending_waits", false);
  json_printf (out, "%" PRIu64, c[STAT_PENDING_WAITS]);
  json_key (out, "lock_contention", false);
  json_printf (out, "%" PRIu64, vs->lock_contention);
  json_key (out, "latency_p50_us", false);
  json_printf (out, "%.1f", vs->requests.latency_p50_ns / 1000.0);
  json_key (out, "latency_p99_us", false);
  json_printf (out, "%.1f", vs->requests.latency_p99_ns / 1000.0);
  json_raw (out, "}");
}

static void
do_stats (struct control_server *srv, struct json_buf *out)
{
  struct snapfg_view_stats vs;
  struct snapfg_snapshot *s;

  snapfg_view_stats (srv->e, NULL, &vs);
  json_raw (out, "{\"ok\":true,\"exports\":[");
  append_stats (out, "origin", &vs);
  for (size_t i = 0; (s = snapfg_snapshot_get_nth (srv->e, i)) != NULL; ++i) {
    snapfg_view_stats (srv->e, s, &vs);
    json_raw (out, ",");
    append_stats (out, snapfg_snapshot_name (s), &vs);
    snapfg_snapshot_put (s);
  }
  json_raw (out, "]}\n");
}

struct changed_state {
  struct json_buf *out;
  bool first;
  uint64_t bytes;
};

static int
append_range (void *opaque, uint64_t offset, uint64_t length)
{
  struct changed_state *cs = opaque;

  json_printf (cs->out, "%s{\"offset\":%" PRIu64 ",\"length\":%" PRIu64 "}",
               cs->first ? "" : ",", offset, length);
  cs->first = false;
  cs->bytes += length;
  return 0;
}

/* Engine errors have been logged with the details; the reply carries the
 * same message, captured here.
 */
static __thread char last_error[512];

static void
capture_error (const char *fmt, va_list args)
{
  vsnprintf (last_error, sizeof last_error, fmt, args);
}

static void
reply_engine_error (struct json_buf *out, int r)
{
  reply_error (out, last_error[0] ? last_error : strerror (-r));
}

static void
do_changed (struct control_server *srv, const struct control_request *req,
            struct json_buf *out)
{
  struct snapfg_snapshot *s = snapfg_snapshot_get (srv->e, req->name);
  struct changed_state cs = { .out = out, .first = true };
  struct json_buf ranges = { 0 };
  char msg[256];
  int r;

  if (s == NULL) {
    snprintf (msg, sizeof msg, "changed: no snapshot named \"%s\"",
              req->name);
    reply_error (out, msg);
    return;
  }
  cs.out = &ranges;
  r = snapfg_snapshot_changed (s, append_range, &cs);
  if (r < 0 && last_error[0])
    reply_error (out, last_error);      /* the engine said why */
  else if (r < 0) {
    snprintf (msg, sizeof msg, "changed %s: %s", req->name, strerror (-r));
    reply_error (out, msg);
  }
  else {
    json_raw (out, "{\"ok\":true,\"name\":");
    json_string (out, req->name);
    json_printf (out, ",\"bytes\":%" PRIu64 ",\"ranges\":[", cs.bytes);
    json_raw (out, ranges.data ? ranges.data : "");
    json_raw (out, "]}\n");
  }
  json_buf_free (&ranges);
  snapfg_snapshot_put (s);
}

static void
execute (struct control_server *srv, const struct control_request *req,
         struct json_buf *out)
{
  struct snapfg_engine *e = srv->e;
  int r;

  last_error[0] = '\0';
  switch (req->cmd) {
  case CONTROL_STATUS:
  case CONTROL_LIST:
    do_status (srv, req, out);
    return;
  case CONTROL_STATS:
    do_stats (srv, out);
    return;
  case CONTROL_CHANGED:
    do_changed (srv, req, out);
    return;
  case CONTROL_CREATE: {
    struct snapfg_snapshot_options o = {
      .name = req->name,
      .cow_path = req->cow,
      .store_type = req->store,
      .chunk_size = req->chunk_size,
      .cow_size = req->cow_size,
    };
    if (req->chunk_size > UINT32_MAX) {
      reply_error (out, "chunk_size: must be between 512 and 1M");
      return;
    }
    if (req->cow[0] != '/' && !device_is_uri (req->cow)) {
      /* The server's working directory is "/", not the client's. */
      reply_error (out, "cow: the path must be absolute (or an NBD URI)");
      return;
    }
    r = snapfg_snapshot_create (e, &o);
    break;
  }
  case CONTROL_DROP:
    r = snapfg_snapshot_drop (e, req->name);
    break;
  case CONTROL_SET_BLOCK_SIZE:
    if (req->block_size > UINT32_MAX) {
      char msg[128];
      snprintf (msg, sizeof msg, "block size %" PRIu64 ": must be 512 or "
                "4096", req->block_size);
      reply_error (out, msg);
      return;
    }
    r = snapfg_set_block_size (e, req->block_size);
    break;
  case CONTROL_MERGE:
    r = snapfg_snapshot_merge (e, req->name);
    break;
  default:
    reply_error (out, "unknown command");
    return;
  }
  if (r < 0)
    reply_engine_error (out, r);
  else
    json_raw (out, "{\"ok\":true}\n");
}

/* --- clients --- */

static void client_cb (struct ev_loop *loop, ev_io *w, int revents);

static void
client_close (struct client *c)
{
  ev_io_stop (c->srv->loop, &c->io);
  close (c->fd);
  *c->pprev = c->next;
  if (c->next)
    c->next->pprev = c->pprev;
  json_buf_free (&c->out);
  free (c);
}

static void
want_write (struct client *c)
{
  ev_io_stop (c->srv->loop, &c->io);
  ev_io_set (&c->io, c->fd, EV_READ | EV_WRITE);
  ev_io_start (c->srv->loop, &c->io);
}

static void
want_write_only (struct client *c)
{
  ev_io_stop (c->srv->loop, &c->io);
  ev_io_set (&c->io, c->fd, EV_WRITE);
  ev_io_start (c->srv->loop, &c->io);
}

static void
handle_line (struct client *c, const char *line, size_t len)
{
  struct control_request req;
  char err[256];

  if (control_parse_request (line, len, &req, err, sizeof err) < 0) {
    snapfg_debug ("control: bad request: %s", err);
    reply_error (&c->out, err);
    return;
  }
  /* The engine logs its errors; capture_error copies them into replies. */
  execute (c->srv, &req, &c->out);
  control_request_free (&req);
}

static void
client_read (struct client *c)
{
  for (;;) {
    ssize_t n = read (c->fd, c->in + c->in_len, sizeof c->in - c->in_len);
    char *nl;

    if (n == 0) {
      /* The client is done sending (it may have hung up mid-line: that
       * part is dropped).  Deliver any replies still queued, then close.
       */
      if (c->out.len > c->out_off) {
        c->close_after_write = true;
        want_write_only (c);
      }
      else
        client_close (c);
      return;
    }
    if (n == -1) {
      if (errno == EAGAIN || errno == EINTR)
        break;
      client_close (c);
      return;
    }
    c->in_len += n;

    while ((nl = memchr (c->in, '\n', c->in_len)) != NULL) {
      size_t len = nl - c->in;

      if (c->discarding)
        c->discarding = false;  /* the end of the overlong line */
      else
        handle_line (c, c->in, len > 0 && c->in[len - 1] == '\r'
                     ? len - 1 : len);
      memmove (c->in, nl + 1, c->in_len - len - 1);
      c->in_len -= len + 1;
    }
    if (c->in_len == sizeof c->in) {
      /* No newline within the bound: refuse it and skip to the next. */
      if (!c->discarding) {
        char msg[128];
        snprintf (msg, sizeof msg, "request longer than %d bytes",
                  CONTROL_MAX_LINE);
        snapfg_debug ("control: %s", msg);
        reply_error (&c->out, msg);
      }
      c->discarding = true;
      c->in_len = 0;
    }
  }
  if (c->out.len > c->out_off)
    want_write (c);
}

static void
client_write (struct client *c)
{
  while (c->out_off < c->out.len) {
    ssize_t n = write (c->fd, c->out.data + c->out_off,
                       c->out.len - c->out_off);
    if (n == -1) {
      if (errno == EAGAIN || errno == EINTR)
        return;
      client_close (c);         /* gone; nothing more to say */
      return;
    }
    c->out_off += n;
  }
  c->out.len = c->out_off = 0;
  if (c->close_after_write) {
    client_close (c);
    return;
  }
  ev_io_stop (c->srv->loop, &c->io);
  ev_io_set (&c->io, c->fd, EV_READ);
  ev_io_start (c->srv->loop, &c->io);
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
accept_cb (struct ev_loop *loop, ev_io *w, int revents)
{
  struct control_server *srv = w->data;
  struct ucred cred;
  socklen_t len = sizeof cred;
  struct client *c;
  int fd;

  fd = accept4 (srv->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd == -1)
    return;
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
  ev_io_init (&c->io, client_cb, fd, EV_READ);
  ev_io_start (loop, &c->io);

  if (getsockopt (fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == -1 ||
      cred.uid != geteuid ()) {
    snapfg_error ("control=%s: refused a client with uid %d (only uid %d "
                  "may use this socket)", srv->path, (int) cred.uid,
                  (int) geteuid ());
    reply_error (&c->out, "permission denied: only the server's owner may "
                 "use this socket");
    c->close_after_write = true;
    want_write (c);
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

  snapfg_set_thread_error_hook (capture_error);
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
