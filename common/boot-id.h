/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: the kernel's id of this boot (boot-id.c).
 *
 * What tells a crash of the process (the page cache, tmpfs and the
 * kernel's state survive) from a crash of the system (they do not).
 * Tests set SNAPFG_TEST_BOOT_ID to play a reboot.
 */
#ifndef SNAPFG_BOOT_ID_H
#define SNAPFG_BOOT_ID_H

#include <stdbool.h>
#include <stddef.h>

/* The boot id ("xxxxxxxx-xxxx-...", 36 characters) into id (len bytes,
 * at least 37).  False if it cannot be read: the caller must then treat
 * every earlier boot's state as another boot's.
 */
extern bool boot_id_read (char *id, size_t len);

#endif
