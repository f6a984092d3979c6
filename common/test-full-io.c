/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* Unit test of common/full-io.c: all the bytes arrive, through short
 * transfers and signals, and the errors are the documented ones.
 */

#include <config.h>

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "full-io.h"
#include "unit-test.h"

#define PIPE_BYTES (1024 * 1024)

static pthread_t main_thread;
static unsigned char *pattern;

/* Interrupting a blocked read or write (no SA_RESTART) is the point. */
static void
on_signal (int sig)
{
  (void) sig;
}

/* Feed the pipe in small pieces, interrupting the reader now and then. */
static void *
trickle_writer (void *arg)
{
  int fd = *(int *) arg;

  for (size_t off = 0, i = 0; off < PIPE_BYTES; ++i) {
    size_t n = 1 + i % 4093;

    if (n > PIPE_BYTES - off)
      n = PIPE_BYTES - off;
    if (write (fd, pattern + off, n) != (ssize_t) n)
      abort ();
    off += n;
    if (i % 7 == 0)
      pthread_kill (main_thread, SIGUSR1);
  }
  close (fd);
  return NULL;
}

/* Drain the pipe in small pieces, interrupting the writer now and then. */
static void *
slow_reader (void *arg)
{
  int fd = *(int *) arg;
  unsigned char *got = malloc (PIPE_BYTES);
  size_t off = 0;

  if (got == NULL)
    abort ();
  for (size_t i = 0; off < PIPE_BYTES; ++i) {
    ssize_t n = read (fd, got + off, 1 + i % 3001);

    if (n <= 0)
      abort ();
    off += n;
    if (i % 5 == 0)
      pthread_kill (main_thread, SIGUSR1);
  }
  if (memcmp (got, pattern, PIPE_BYTES) != 0)
    abort ();
  free (got);
  return NULL;
}

int
main (void)
{
  struct sigaction sa = { .sa_handler = on_signal };
  char path[] = "/tmp/test-full-io.XXXXXX";
  unsigned char buf[100];
  pthread_t t;
  int p[2], fd;

  main_thread = pthread_self ();
  sigemptyset (&sa.sa_mask);
  CHECK (sigaction (SIGUSR1, &sa, NULL) == 0);
  pattern = malloc (PIPE_BYTES);
  CHECK (pattern != NULL);
  for (size_t i = 0; i < PIPE_BYTES; ++i)
    pattern[i] = (i * 7919) >> 3;

  /* Reads from a pipe fed in small pieces, interrupted by signals. */
  CHECK (pipe (p) == 0);
  CHECK (pthread_create (&t, NULL, trickle_writer, &p[1]) == 0);
  {
    unsigned char *got = malloc (PIPE_BYTES);

    CHECK (got != NULL);
    CHECK (full_read (p[0], got, PIPE_BYTES) == 0);
    CHECK (memcmp (got, pattern, PIPE_BYTES) == 0);
    /* The writer closed its end: the next read ends early. */
    errno = 0;
    CHECK (full_read (p[0], got, 1) == -ENODATA);
    CHECK (errno == ENODATA);
    free (got);
  }
  CHECK (pthread_join (t, NULL) == 0);
  close (p[0]);

  /* Writes into a pipe drained slowly, interrupted by signals (a write
   * into a full pipe returns short when a signal arrives).
   */
  CHECK (pipe (p) == 0);
  CHECK (pthread_create (&t, NULL, slow_reader, &p[0]) == 0);
  CHECK (full_write (p[1], pattern, PIPE_BYTES) == 0);
  CHECK (pthread_join (t, NULL) == 0);
  close (p[0]);
  /* Nobody reads any more: EPIPE, not a signal that kills the test. */
  signal (SIGPIPE, SIG_IGN);
  CHECK (full_write (p[1], pattern, 10) == -EPIPE);
  CHECK (errno == EPIPE);
  close (p[1]);

  /* Positioned I/O on a file. */
  fd = mkstemp (path);
  CHECK (fd >= 0);
  unlink (path);
  CHECK (full_pwrite (fd, pattern, 4096, 8192) == 0);
  CHECK (full_pread (fd, buf, sizeof buf, 8192 + 17) == 0);
  CHECK (memcmp (buf, pattern + 17, sizeof buf) == 0);
  /* The hole before the data reads as zeroes. */
  CHECK (full_pread (fd, buf, sizeof buf, 100) == 0);
  for (size_t i = 0; i < sizeof buf; ++i)
    CHECK (buf[i] == 0);
  /* Past the end: the file is shorter than asked. */
  CHECK (full_pread (fd, buf, sizeof buf, 8192 + 4096 - 10) == -ENODATA);
  CHECK (full_pread (fd, buf, 1, 1 << 20) == -ENODATA);
  /* The unpositioned calls move the file offset. */
  CHECK (lseek (fd, 8192, SEEK_SET) == 8192);
  CHECK (full_read (fd, buf, 50) == 0 && full_read (fd, buf + 50, 50) == 0);
  CHECK (memcmp (buf, pattern, 100) == 0);
  CHECK (full_write (fd, "abc", 3) == 0);
  CHECK (full_pread (fd, buf, 3, 8292) == 0 && memcmp (buf, "abc", 3) == 0);
  /* Nothing to move is success. */
  CHECK (full_read (fd, buf, 0) == 0 && full_write (fd, buf, 0) == 0);
  close (fd);

  /* A bad descriptor is the kernel's error. */
  CHECK (full_read (fd, buf, 1) == -EBADF && errno == EBADF);
  CHECK (full_pwrite (fd, buf, 1, 0) == -EBADF);
  free (pattern);
  return 0;
}
