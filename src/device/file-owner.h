/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: who may own and write a state file (the catalogue, its state
 * directory and the stores in it).
 */

#ifndef SNAPFG_FILE_OWNER_H
#define SNAPFG_FILE_OWNER_H

#include <stdbool.h>

/* Check that the file or directory open as fd (a state file, called
 * path) is owned by this process's user and not writable by its group
 * or others (as OpenSSH's StrictModes); logs what is wrong and how to
 * fix it (chown, chmod) and returns -EPERM.
 */
extern int file_check_owner (int fd, const char *path, bool directory);

#endif
