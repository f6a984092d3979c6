/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: a new random (version 4) UUID, as text.
 *
 * The catalogue's id, each snapshot's uuid and the store bindings that
 * name them use these: 36 characters, lower-case hex, RFC 4122 form.
 */
#ifndef SNAPFG_RANDOM_UUID_H
#define SNAPFG_RANDOM_UUID_H

#define RANDOM_UUID_LEN 36

extern void random_uuid (char out[RANDOM_UUID_LEN + 1]);

#endif
