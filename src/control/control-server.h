/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: the control socket server (control=PATH).
 *
 * A Unix socket, mode 0600, served by a libev event loop on its own
 * thread.  Only the socket's owner (SO_PEERCRED) may use it.  Requests
 * and replies follow control-protocol.h; each request is run by
 * control_execute (control-handlers.h).  A client that does not read its
 * replies is not read from either once 256 KiB of them are queued.
 */
#ifndef SNAPFG_CONTROL_SERVER_H
#define SNAPFG_CONTROL_SERVER_H

#include "engine.h"

struct control_server;

/* Create and bind the socket (refusing to replace anything that is not
 * a stale socket).  Says why and returns -errno on failure.
 */
extern int control_server_open (struct snapfg_engine *e, const char *path,
                                 struct control_server **srvp);
/* Start serving on a new thread (call after nbdkit has forked). */
extern int control_server_start (struct control_server *srv);
/* Stop the thread, close every client, remove the socket. */
extern void control_server_close (struct control_server *srv);

#endif
