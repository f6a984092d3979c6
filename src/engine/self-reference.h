/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: recognising an NBD URI that names this server itself (see
 * self-reference.c).
 */
#ifndef SNAPFG_SELF_REFERENCE_H
#define SNAPFG_SELF_REFERENCE_H

#include <stdbool.h>
#include <stddef.h>

/* Does this NBD URI point at one of this process's own NBD sockets?
 * If so, fills why ("names this server's own socket ...").
 */
extern bool self_reference_uri (const char *uri, char *why, size_t why_len);

#endif
