/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* Unit test of the checkpoint bitmap (src/cbt-bitmap.c): the file
 * mirrors every mark before cbt_bitmap_mark returns, a reopen under the
 * same boot id keeps the bits, under another boot id a bitmap left in
 * use is inconsistent, a clean one is not, OR across granularities, and
 * concurrent first marks of one word lose no bit in the file.
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <inttypes.h>
#include <unistd.h>
#include <fcntl.h>
#include <endian.h>
#include <pthread.h>

#include "cbt-bitmap.h"
#include "unit-test.h"

/* Read granule g's bit straight from the file (another descriptor: what
 * a process started after a kill -9 would see).
 */
static int
file_bit (const char *path, uint64_t g)
{
  int fd = open (path, O_RDONLY);
  uint64_t w = 0;

  if (fd == -1 ||
      pread (fd, &w, 8, CBT_HEADER_SIZE + (g / 64) * 8) != 8) {
    if (fd >= 0)
      close (fd);
    return -1;
  }
  close (fd);
  return (le64toh (w) >> (g % 64)) & 1;
}

static uint32_t
file_flags (const char *path)
{
  int fd = open (path, O_RDONLY);
  uint32_t f = 0;

  if (fd >= 0 && pread (fd, &f, 4, 20) != 4)
    f = 0xffffffff;
  if (fd >= 0)
    close (fd);
  return le32toh (f);
}

struct racer {
  struct cbt_bitmap *bm;
  int id;
};

static void *
race (void *arg)
{
  struct racer *r = arg;

  /* Each thread marks its own granules of the same few words. */
  for (uint64_t g = r->id; g < 256; g += 8)
    cbt_bitmap_mark (r->bm, g * 65536, 1);
  return NULL;
}

int
main (void)
{
  char dir[] = "/tmp/test-cbt-bitmapXXXXXX";
  char path[256], path2[256], why[512];
  const uint64_t size = 100 * 65536 + 1000;  /* a partial last granule */
  struct cbt_bitmap *bm, *bm2, *mem;
  int r;

  if (mkdtemp (dir) == NULL) {
    perror ("mkdtemp");
    return 1;
  }
  snprintf (path, sizeof path, "%s/a.cbt", dir);
  snprintf (path2, sizeof path2, "%s/b.cbt", dir);
  setenv ("SNAPFG_TEST_BOOT_ID", "boot-one", 1);

  /* Parameter checks. */
  CHECK (cbt_check_granularity (65536, 4096) == NULL);
  CHECK (cbt_check_granularity (3 * 4096, 4096) != NULL);
  CHECK (cbt_check_granularity (2048, 4096) != NULL);
  CHECK (cbt_check_granularity (0, 512) != NULL);

  r = cbt_bitmap_create (path, 65536, size, NULL, &bm);
  CHECK (r == 0);
  if (r < 0)
    return 1;
  CHECK (bm->granules == 101);
  CHECK (file_flags (path) == CBT_FLAG_DIRTY);
  /* O_EXCL: never replaces a file. */
  CHECK (cbt_bitmap_create (path, 65536, size, NULL, &bm2) < 0);

  /* A mark is in the file when mark returns (no sync needed). */
  cbt_bitmap_mark (bm, 65536 * 3 + 10, 1);
  CHECK (file_bit (path, 3) == 1);
  CHECK (file_bit (path, 2) == 0 && file_bit (path, 4) == 0);
  /* Spanning granules 5..7, and past the end (clipped). */
  cbt_bitmap_mark (bm, 65536 * 5 + 1, 2 * 65536);
  CHECK (file_bit (path, 5) && file_bit (path, 6) && file_bit (path, 7));
  CHECK (!file_bit (path, 8));
  cbt_bitmap_mark (bm, size - 1, 100000);
  CHECK (file_bit (path, 100) == 1);
  cbt_bitmap_mark (bm, size + 5, 10);   /* past the end: nothing */
  CHECK (cbt_bitmap_count (bm) == 5);
  CHECK (cbt_bitmap_sync (bm) == 0);

  /* Concurrent first marks of the same words. */
  {
    struct cbt_bitmap *big;
    pthread_t t[8];
    struct racer rc[8];
    int all = 1;

    r = cbt_bitmap_create (path2, 65536, 256 * 65536, NULL, &big);
    CHECK (r == 0);
    for (int i = 0; i < 8; ++i) {
      rc[i].bm = big;
      rc[i].id = i;
      pthread_create (&t[i], NULL, race, &rc[i]);
    }
    for (int i = 0; i < 8; ++i)
      pthread_join (t[i], NULL);
    for (uint64_t g = 0; g < 256; ++g)
      all &= file_bit (path2, g) == 1;
    CHECK (all);
    CHECK (cbt_bitmap_count (big) == 256);
    cbt_bitmap_close (big);
    unlink (path2);
  }

  /* "kill -9": close without cleaning; same boot: consistent, bits kept. */
  cbt_bitmap_close (bm);
  r = cbt_bitmap_open (path, size, NULL, &bm, why, sizeof why);
  CHECK (r == 0);
  CHECK (!bm->inconsistent);
  CHECK (cbt_bitmap_count (bm) == 5 && cbt_bitmap_test (bm, 3));
  /* A wrong origin size is refused. */
  CHECK (cbt_bitmap_open (path, size + 512, NULL, &bm2, why, sizeof why) < 0);
  cbt_bitmap_close (bm);

  /* Another boot while in use: inconsistent, and flagged in the file. */
  setenv ("SNAPFG_TEST_BOOT_ID", "boot-two", 1);
  r = cbt_bitmap_open (path, size, NULL, &bm, why, sizeof why);
  CHECK (r == 0 && bm->inconsistent);
  CHECK (strstr (why, "uncleanly") != NULL);
  CHECK (file_flags (path) & CBT_FLAG_INCONSISTENT);
  cbt_bitmap_close (bm);
  unlink (path);

  /* A clean close survives another boot. */
  r = cbt_bitmap_create (path, 65536, size, NULL, &bm);
  CHECK (r == 0);
  cbt_bitmap_mark (bm, 0, 1);
  CHECK (cbt_bitmap_set_clean (bm) == 0);
  CHECK (file_flags (path) == CBT_FLAG_SUMMED);
  cbt_bitmap_close (bm);
  setenv ("SNAPFG_TEST_BOOT_ID", "boot-three", 1);
  r = cbt_bitmap_open (path, size, NULL, &bm, why, sizeof why);
  CHECK (r == 0 && !bm->inconsistent && cbt_bitmap_count (bm) == 1);
  CHECK (cbt_bitmap_set_dirty (bm) == 0);
  CHECK ((file_flags (path) & ~CBT_FLAG_BOUND) == CBT_FLAG_DIRTY);

  /* OR into a finer bitmap: 64K granule 2 covers 4K granules 32..47. */
  mem = cbt_bitmap_new_memory (4096, size);
  CHECK (mem != NULL);
  cbt_bitmap_mark (bm, 2 * 65536, 1);
  CHECK (cbt_bitmap_or (mem, bm) == 0);
  CHECK (cbt_bitmap_count (mem) == 32);
  CHECK (cbt_bitmap_test (mem, 32) && cbt_bitmap_test (mem, 47) &&
         !cbt_bitmap_test (mem, 48) && cbt_bitmap_test (mem, 0));
  cbt_bitmap_close (mem);
  cbt_bitmap_close (bm);

  /* Not a bitmap: refused, untouched. */
  {
    int fd = open (path2, O_CREAT | O_WRONLY, 0600);
    char junk[8192];

    memset (junk, 'x', sizeof junk);
    CHECK (write (fd, junk, sizeof junk) == sizeof junk);
    close (fd);
    CHECK (cbt_bitmap_open (path2, size, NULL, &bm, why, sizeof why) < 0);
    CHECK (strstr (why, "not a snapfg checkpoint bitmap") != NULL);
    unlink (path2);
  }

  unlink (path);

  /* Bindings: a bitmap is its checkpoint's, its catalogue's and its
   * origin's; a clean close's checksum covers the bits.
   */
  {
    struct cbt_binding a = { .catalogue_id = "11111111-2222-4333-8444-555555555555",
                             .seq = 3, .name = "a", .origin_dev = 2049,
                             .origin_ino = 77 };
    struct cbt_binding b = a, other = a, moved = a;
    int fd;
    uint64_t w;

    b.seq = 4;
    strcpy (b.name, "b");
    strcpy (other.catalogue_id, "99999999-2222-4333-8444-555555555555");
    moved.origin_ino = 78;

    CHECK (cbt_bitmap_create (path, 65536, size, &a, &bm) == 0);
    cbt_bitmap_mark (bm, 5 * 65536, 1);
    CHECK (cbt_bitmap_set_clean (bm) == 0);
    CHECK (file_flags (path) == (CBT_FLAG_BOUND | CBT_FLAG_SUMMED));
    cbt_bitmap_close (bm);

    /* Its own: fine. */
    CHECK (cbt_bitmap_open (path, size, &a, &bm, why, sizeof why) == 0);
    CHECK (!bm->inconsistent && !bm->foreign);
    cbt_bitmap_close (bm);
    /* Another checkpoint's, another catalogue's: foreign, untouched. */
    CHECK (cbt_bitmap_open (path, size, &b, &bm, why, sizeof why) == 0);
    CHECK (bm->inconsistent && bm->foreign);
    CHECK (strstr (why, "belongs to checkpoint \"a\"") != NULL);
    cbt_bitmap_set_inconsistent (bm, "test", 0);    /* never written */
    cbt_bitmap_close (bm);
    CHECK (file_flags (path) == (CBT_FLAG_BOUND | CBT_FLAG_SUMMED));
    CHECK (cbt_bitmap_open (path, size, &other, &bm, why, sizeof why) == 0);
    CHECK (bm->inconsistent && bm->foreign);
    CHECK (strstr (why, "another catalogue") != NULL);
    cbt_bitmap_close (bm);
    /* Another origin identity: inconsistent, unless origin-moved. */
    CHECK (cbt_bitmap_open (path, size, &moved, &bm, why, sizeof why) == 0);
    CHECK (bm->inconsistent && !bm->foreign);
    CHECK (strstr (why, "another origin") != NULL);
    cbt_bitmap_close (bm);
    moved.origin_moved = true;
    CHECK (cbt_bitmap_open (path, size, &moved, &bm, why, sizeof why) == 0);
    CHECK (!bm->inconsistent && bm->binding.origin_ino == 78);
    CHECK (cbt_bitmap_set_clean (bm) == 0);         /* rebound */
    cbt_bitmap_close (bm);
    moved.origin_moved = false;
    CHECK (cbt_bitmap_open (path, size, &moved, &bm, why, sizeof why) == 0);
    CHECK (!bm->inconsistent);
    cbt_bitmap_close (bm);

    /* A flipped bit under a clean close's checksum. */
    fd = open (path, O_RDWR);
    CHECK (fd >= 0 && pread (fd, &w, 8, CBT_HEADER_SIZE) == 8);
    w ^= htole64 (1u << 9);
    CHECK (pwrite (fd, &w, 8, CBT_HEADER_SIZE) == 8);
    close (fd);
    CHECK (cbt_bitmap_open (path, size, &moved, &bm, why, sizeof why) == 0);
    CHECK (bm->inconsistent && strstr (why, "checksum") != NULL);
    cbt_bitmap_close (bm);
    unlink (path);

    /* OR into a clean bitmap keeps its checksum right. */
    CHECK (cbt_bitmap_create (path, 65536, size, &a, &bm) == 0);
    CHECK (cbt_bitmap_set_clean (bm) == 0);
    mem = cbt_bitmap_new_memory (65536, size);
    cbt_bitmap_mark (mem, 7 * 65536, 1);
    CHECK (cbt_bitmap_or (bm, mem) == 0);
    cbt_bitmap_close (mem);
    cbt_bitmap_close (bm);
    CHECK (file_flags (path) == (CBT_FLAG_BOUND | CBT_FLAG_SUMMED));
    CHECK (cbt_bitmap_open (path, size, &a, &bm, why, sizeof why) == 0);
    CHECK (!bm->inconsistent && cbt_bitmap_test (bm, 7));
    cbt_bitmap_close (bm);
    unlink (path);

    /* No binding (an older snapfg's): taken, and bound when written. */
    CHECK (cbt_bitmap_create (path, 65536, size, NULL, &bm) == 0);
    CHECK (cbt_bitmap_set_clean (bm) == 0);
    cbt_bitmap_close (bm);
    CHECK (file_flags (path) == CBT_FLAG_SUMMED);
    CHECK (cbt_bitmap_open (path, size, &b, &bm, why, sizeof why) == 0);
    CHECK (!bm->inconsistent);
    CHECK (cbt_bitmap_set_clean (bm) == 0);
    cbt_bitmap_close (bm);
    CHECK (file_flags (path) == (CBT_FLAG_BOUND | CBT_FLAG_SUMMED));
    CHECK (cbt_bitmap_open (path, size, &a, &bm, why, sizeof why) == 0);
    CHECK (bm->foreign);
    cbt_bitmap_close (bm);
    unlink (path);
  }

  rmdir (dir);
  printf ("test-cbt-bitmap: PASS\n");
  return 0;
}
