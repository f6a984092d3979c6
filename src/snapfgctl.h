/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfgctl: the parts shared by its source files.
 *
 *   snapfgctl.c             command line, usage, talking to the server,
 *                           human output
 *   snapfgctl-inspect.c     inspect: reading a COW store on disk
 *   snapfgctl-prometheus.c  stats --prometheus
 */
#ifndef SNAPFG_SNAPFGCTL_H
#define SNAPFG_SNAPFGCTL_H

#include <stdbool.h>

#include <jansson.h>

/* Exit statuses (documented in snapfgctl(1)). */
#define EXIT_OK          0
#define EXIT_REFUSED     1      /* the server refused; inspect: bad store */
#define EXIT_USAGE       2
#define EXIT_UNREACHABLE 3      /* no connection or no reply */

/* inspect COW: print the store's header and usage (or JSON). */
extern int snapfgctl_inspect (const char *path, bool exceptions,
                              bool json_output);

/* Print the stats and status replies in the Prometheus text format. */
extern void snapfgctl_print_prometheus (json_t *stats, json_t *status);

#endif
