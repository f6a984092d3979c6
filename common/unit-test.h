/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: what the C unit tests share: a failure that names the check. */
#ifndef SNAPFG_UNIT_TEST_H
#define SNAPFG_UNIT_TEST_H

#include <stdio.h>
#include <stdlib.h>

#define FAIL(...) do { fprintf (stderr, "FAIL: " __VA_ARGS__);             \
    fputc ('\n', stderr); exit (EXIT_FAILURE); } while (0)

/* Check a condition; on failure say which, where. */
#define CHECK(cond) do { if (!(cond))                                     \
      FAIL ("%s:%d: %s", __FILE__, __LINE__, #cond); } while (0)

#endif
