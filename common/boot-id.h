/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: the kernel's id of this boot.
 *
 * What tells a crash of the process (the page cache, and so every write
 * the process made, survives) from a crash of the system (it does not):
 * the persistent store's unsynced mark, the checkpoint bitmaps' dirty
 * flag and write-back's held file record the boot that wrote them.  Tests simulate a reboot with
 * SNAPFG_TEST_BOOT_ID, which, when set and not empty, is the id.
 */
#ifndef SNAPFG_BOOT_ID_H
#define SNAPFG_BOOT_ID_H

#include <stddef.h>

/* A boot id is 36 characters (a UUID); this holds it and its NUL. */
#define BOOT_ID_SIZE 40

/* Put this boot's id (without the newline) in id[0..len).  Returns 0, or
 * a negative errno when it cannot be read (no /proc, or an empty file:
 * -ENODATA); id is then "".  The callers decide what an unknown boot
 * means for them.
 */
extern int read_boot_id (char *id, size_t len);

#endif
