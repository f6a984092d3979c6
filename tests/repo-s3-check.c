/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* A driver of the S3 back end alone (repo-store.h over repo-store-s3.c),
 * run by tests/test-repo-s3.sh against a real S3 gateway.  Endpoint,
 * region and keys come from the AWS environment variables, as in the
 * tools.
 *
 *   repo-s3-check ops s3://BUCKET/PREFIX
 *       every operation, with data checked byte for byte: put, put
 *       if_absent (twice, and raced by 8 threads), get, head, touch, del,
 *       list of more than 1000 keys (continuation), many threads at once
 *   repo-s3-check put-get s3://BUCKET/PREFIX KEY TEXT
 *       open, store TEXT under KEY, read it back, close (so that another
 *       client can check what the back end stored)
 *   repo-s3-check flaky s3://BUCKET/PREFIX
 *       against tests/s3-fault-server.py flaky: every request's 503s are
 *       retried until it succeeds
 *   repo-s3-check lost-reply s3://BUCKET/PREFIX
 *       against s3-fault-server.py lost-reply: a put if_absent whose
 *       first attempt was stored but not answered succeeds on its retry
 *       (it finds its own bytes), and a second one is -EEXIST
 *   repo-s3-check open-fails s3://BUCKET/PREFIX ERRNO-NAME TEXT...
 *       opening must fail with that errno and a message holding each TEXT
 */
#include <config.h>

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "unit-test.h"
#include "snapfg-error.h"
#include "repo-store.h"
#include "repo-s3-config.h"

#define LIST_KEYS 1100          /* > 1000: ListObjectsV2 needs 2 pages */
#define THREADS 8

static struct repo_store *store;

#define CHECK_OK(call) do { int r_ = (call);                             \
    if (r_ != 0) FAIL ("%s:%d: %s = %d: %s", __FILE__, __LINE__, #call,   \
                       r_, snapfg_get_error () ?: "(no message)");        \
  } while (0)

static void
fill (unsigned char *buf, size_t len, unsigned seed)
{
  size_t i;
  uint32_t x = seed * 2654435761u + 1;

  for (i = 0; i < len; i++) {
    x = x * 1103515245 + 12345;
    buf[i] = x >> 16;
  }
}

static void
check_object (const char *key, const void *want, size_t want_len)
{
  void *got = NULL;
  size_t len = 0;

  CHECK_OK (store->ops->get (store, key, &got, &len));
  if (len != want_len || memcmp (got, want, len) != 0)
    FAIL ("%s: got %zu bytes, want %zu, or they differ", key, len, want_len);
  free (got);
}

/* --- put, get, head, del, touch ----------------------------------- */

static void
test_basic (void)
{
  size_t len = 4 << 20;
  unsigned char *a = malloc (len), *b = malloc (len);
  struct repo_object_info info;
  void *got;
  size_t got_len;
  time_t t0 = time (NULL);

  CHECK (a && b);
  fill (a, len, 1);
  fill (b, len, 2);

  /* Plain put, then replace. */
  CHECK_OK (store->ops->put (store, "chunks/aa/obj", a, len, false));
  check_object ("chunks/aa/obj", a, len);
  CHECK_OK (store->ops->put (store, "chunks/aa/obj", b, len, false));
  check_object ("chunks/aa/obj", b, len);

  /* if_absent: first wins, second is -EEXIST and changes nothing. */
  CHECK_OK (store->ops->put (store, "runs/0001", a, 1000, true));
  CHECK (store->ops->put (store, "runs/0001", b, 2000, true) == -EEXIST);
  CHECK (strstr (snapfg_get_error (), "runs/0001"));
  check_object ("runs/0001", a, 1000);

  /* An empty object. */
  CHECK_OK (store->ops->put (store, "empty", "", 0, false));
  CHECK_OK (store->ops->get (store, "empty", &got, &got_len));
  CHECK (got != NULL && got_len == 0);
  free (got);

  /* head */
  CHECK_OK (store->ops->head (store, "chunks/aa/obj", &info));
  CHECK (info.size == len);
  if (info.mtime < t0 - 120 || info.mtime > time (NULL) + 120)
    FAIL ("head mtime %lld is not about now (%lld)",
          (long long) info.mtime, (long long) t0);

  /* Missing objects. */
  CHECK (store->ops->get (store, "chunks/no/such", &got, &got_len) == -ENOENT);
  CHECK (strstr (snapfg_get_error (), "chunks/no/such"));
  CHECK (strstr (snapfg_get_error (), "404"));
  CHECK (strstr (snapfg_get_error (), "NoSuchKey"));
  CHECK (store->ops->head (store, "chunks/no/such", &info) == -ENOENT);
  CHECK (store->ops->touch (store, "chunks/no/such") == -ENOENT);
  CHECK (store->ops->del (store, "chunks/no/such") == -ENOENT);

  /* Keys the interface does not allow. */
  CHECK (store->ops->put (store, "../x", a, 1, false) == -EINVAL);
  CHECK (store->ops->put (store, "a//b", a, 1, false) == -EINVAL);
  CHECK (store->ops->put (store, "a b", a, 1, false) == -EINVAL);
  CHECK (store->ops->get (store, "", &got, &got_len) == -EINVAL);
  CHECK (store->ops->put (store, "a/", a, 1, false) == -EINVAL);

  /* touch moves mtime forward and keeps the data. */
  {
    struct repo_object_info before, after;

    CHECK_OK (store->ops->head (store, "runs/0001", &before));
    sleep (2);
    CHECK_OK (store->ops->touch (store, "runs/0001"));
    CHECK_OK (store->ops->head (store, "runs/0001", &after));
    if (after.mtime <= before.mtime)
      FAIL ("touch: mtime %lld -> %lld did not move forward",
            (long long) before.mtime, (long long) after.mtime);
    CHECK (after.size == 1000);
    check_object ("runs/0001", a, 1000);
    /* A touched object is still protected by if_absent. */
    CHECK (store->ops->put (store, "runs/0001", b, 10, true) == -EEXIST);
  }

  /* del */
  CHECK_OK (store->ops->del (store, "chunks/aa/obj"));
  CHECK (store->ops->get (store, "chunks/aa/obj", &got, &got_len) == -ENOENT);
  CHECK (store->ops->del (store, "chunks/aa/obj") == -ENOENT);
  /* After a del, if_absent may create it again. */
  CHECK_OK (store->ops->del (store, "runs/0001"));
  CHECK_OK (store->ops->put (store, "runs/0001", b, 10, true));
  check_object ("runs/0001", b, 10);
  CHECK_OK (store->ops->del (store, "runs/0001"));
  CHECK_OK (store->ops->del (store, "empty"));

  free (a);
  free (b);
  printf ("basic: put, put if_absent, get, head, touch, del: ok\n");
}

/* --- many threads ---------------------------------------------------- */

struct worker {
  pthread_t t;
  int id;
  int won;                      /* if_absent race: did this one win? */
  unsigned char *buf;
};

static void *
race_worker (void *opaque)
{
  struct worker *w = opaque;
  int r = store->ops->put (store, "race/number", w->buf, 64, true);

  if (r == 0)
    w->won = 1;
  else if (r != -EEXIST)
    FAIL ("race: thread %d: put = %d: %s", w->id, r, snapfg_get_error ());
  return NULL;
}

static void *
list_writer (void *opaque)
{
  struct worker *w = opaque;
  int i;

  for (i = w->id; i < LIST_KEYS; i += THREADS) {
    char key[64];
    unsigned char data[16];

    snprintf (key, sizeof key, "list/%02x/%05d", i % 251, i);
    fill (data, sizeof data, i);
    CHECK_OK (store->ops->put (store, key, data, (i % 16) + 1, false));
  }
  return NULL;
}

static void *
reader (void *opaque)
{
  struct worker *w = opaque;
  int i;

  for (i = w->id; i < LIST_KEYS; i += THREADS * 4) {
    char key[64];
    unsigned char data[16];

    snprintf (key, sizeof key, "list/%02x/%05d", i % 251, i);
    fill (data, sizeof data, i);
    check_object (key, data, (i % 16) + 1);
  }
  return NULL;
}

static void
run_threads (void *(*fn) (void *), struct worker *w)
{
  int i;

  for (i = 0; i < THREADS; i++) {
    w[i].id = i;
    CHECK (pthread_create (&w[i].t, NULL, fn, &w[i]) == 0);
  }
  for (i = 0; i < THREADS; i++)
    CHECK (pthread_join (w[i].t, NULL) == 0);
}

static void
test_race (void)
{
  struct worker w[THREADS] = { 0 };
  unsigned char bufs[THREADS][64];
  void *got;
  size_t len;
  int i, winners = 0, winner = -1;

  for (i = 0; i < THREADS; i++) {
    fill (bufs[i], 64, 100 + i);
    w[i].buf = bufs[i];
  }
  run_threads (race_worker, w);
  for (i = 0; i < THREADS; i++)
    if (w[i].won) {
      winners++;
      winner = i;
    }
  if (winners != 1)
    FAIL ("race: %d of %d threads created race/number, want exactly 1",
          winners, THREADS);
  CHECK_OK (store->ops->get (store, "race/number", &got, &len));
  CHECK (len == 64 && memcmp (got, bufs[winner], 64) == 0);
  free (got);
  CHECK_OK (store->ops->del (store, "race/number"));
  printf ("race: %d threads put if_absent one key, exactly one won: ok\n",
          THREADS);
}

struct listed {
  unsigned char seen[LIST_KEYS];
  int n, others, stop_after;
};

static int
on_listed (void *opaque, const struct repo_object_info *info)
{
  struct listed *l = opaque;
  int x, i;
  unsigned hi;
  char tail;

  if (sscanf (info->key, "list/%2x/%5d%c", &hi, &i, &tail) != 2
      || i < 0 || i >= LIST_KEYS || hi != (unsigned) (i % 251)) {
    l->others++;
    return 0;
  }
  x = i;
  if (l->seen[x])
    FAIL ("list: %s reported twice", info->key);
  if (info->size != (uint64_t) (x % 16) + 1)
    FAIL ("list: %s has size %llu, want %d", info->key,
          (unsigned long long) info->size, (x % 16) + 1);
  if (info->mtime < time (NULL) - 3600 || info->mtime > time (NULL) + 3600)
    FAIL ("list: %s has mtime %lld", info->key, (long long) info->mtime);
  l->seen[x] = 1;
  l->n++;
  if (l->stop_after && l->n == l->stop_after)
    return 7;
  return 0;
}

static int
count_only (void *opaque, const struct repo_object_info *info)
{
  (*(int *) opaque)++;
  return 0;
}

static void
test_list_and_threads (void)
{
  struct worker w[THREADS] = { 0 };
  struct listed *l = calloc (1, sizeof *l);
  int i, n;

  CHECK (l);
  run_threads (list_writer, w);
  run_threads (reader, w);

  /* An unrelated object beside the prefix: not listed under "list/". */
  CHECK_OK (store->ops->put (store, "listx", "x", 1, false));

  CHECK_OK (store->ops->list (store, "list/", on_listed, l));
  if (l->n != LIST_KEYS || l->others != 0)
    FAIL ("list: %d of %d keys listed, %d others", l->n, LIST_KEYS, l->others);
  for (i = 0; i < LIST_KEYS; i++)
    CHECK (l->seen[i]);

  /* The callback's non-zero value stops the walk and is returned. */
  memset (l, 0, sizeof *l);
  l->stop_after = 5;
  CHECK (store->ops->list (store, "list/", on_listed, l) == 7);
  CHECK (l->n == 5);

  /* A prefix within a component, and one that matches nothing. */
  n = 0;
  CHECK_OK (store->ops->list (store, "list/0", count_only, &n));
  CHECK (n > 0 && n < LIST_KEYS);
  n = 0;
  CHECK_OK (store->ops->list (store, "nothing/", count_only, &n));
  CHECK (n == 0);
  /* The whole store: the listed keys and "listx". */
  n = 0;
  CHECK_OK (store->ops->list (store, "", count_only, &n));
  CHECK (n == LIST_KEYS + 1);
  CHECK (store->ops->list (store, "../", count_only, &n) == -EINVAL);

  for (i = 0; i < LIST_KEYS; i++) {
    char key[64];

    snprintf (key, sizeof key, "list/%02x/%05d", i % 251, i);
    CHECK_OK (store->ops->del (store, key));
  }
  CHECK_OK (store->ops->del (store, "listx"));
  n = 0;
  CHECK_OK (store->ops->list (store, "", count_only, &n));
  CHECK (n == 0);
  free (l);
  printf ("list: %d keys over 2 pages, %d threads writing and reading: ok\n",
          LIST_KEYS, THREADS);
}

static int
open_store (const char *url, struct repo_store **s)
{
  struct repo_s3_options o;

  repo_s3_options_from_env (&o, getenv ("S3_ENDPOINT_OPTION"),
                            getenv ("S3_CREDENTIALS_OPTION"));
  snapfg_clear_error ();
  return repo_store_s3_open (url, &o, s);
}

static const struct { const char *name; int err; } errnos[] = {
  { "ENOENT", ENOENT }, { "EACCES", EACCES }, { "ENXIO", ENXIO },
  { "ECONNREFUSED", ECONNREFUSED }, { "EINVAL", EINVAL },
  { "ENOKEY", ENOKEY }, { "EHOSTUNREACH", EHOSTUNREACH }, { "EIO", EIO },
};

int
main (int argc, char *argv[])
{
  setvbuf (stdout, NULL, _IOLBF, 0);
  if (argc == 3 && strcmp (argv[1], "ops") == 0) {
    CHECK_OK (open_store (argv[2], &store));
    CHECK (strcmp (store->ops->name, "s3") == 0);
    CHECK (strcmp (store->location, argv[2]) == 0);
    test_basic ();
    test_race ();
    test_list_and_threads ();
    store->ops->close (store);
    return 0;
  }
  if (argc == 3 && strcmp (argv[1], "flaky") == 0) {
    struct repo_object_info info;
    int n = 0;

    CHECK_OK (open_store (argv[2], &store));
    CHECK_OK (store->ops->put (store, "a/b", "data", 4, false));
    check_object ("a/b", "data", 4);
    CHECK_OK (store->ops->head (store, "a/b", &info));
    CHECK (info.size == 4 && info.mtime == 1767225600);
    CHECK_OK (store->ops->list (store, "a/", count_only, &n));
    CHECK (n == 1);
    CHECK_OK (store->ops->del (store, "a/b"));
    store->ops->close (store);
    printf ("flaky: every operation retried past two 503s: ok\n");
    return 0;
  }
  if (argc == 3 && strcmp (argv[1], "lost-reply") == 0) {
    CHECK_OK (open_store (argv[2], &store));
    CHECK_OK (store->ops->put (store, "runs/0001", "mine", 4, true));
    check_object ("runs/0001", "mine", 4);
    CHECK (store->ops->put (store, "runs/0001", "other", 5, true) == -EEXIST);
    check_object ("runs/0001", "mine", 4);
    store->ops->close (store);
    printf ("lost-reply: a retried put if_absent finds its own object: ok\n");
    return 0;
  }
  if (argc == 5 && strcmp (argv[1], "put-get") == 0) {
    CHECK_OK (open_store (argv[2], &store));
    CHECK_OK (store->ops->put (store, argv[3], argv[4], strlen (argv[4]),
                               false));
    check_object (argv[3], argv[4], strlen (argv[4]));
    store->ops->close (store);
    printf ("put-get %s %s: ok\n", argv[2], argv[3]);
    return 0;
  }
  if (argc >= 4 && strcmp (argv[1], "open-fails") == 0) {
    int want = 0, r, i;
    const char *msg;

    for (i = 0; i < (int) (sizeof errnos / sizeof errnos[0]); i++)
      if (strcmp (argv[3], errnos[i].name) == 0)
        want = errnos[i].err;
    if (want == 0)
      FAIL ("unknown errno name %s", argv[3]);
    r = open_store (argv[2], &store);
    msg = snapfg_get_error () ?: "";
    printf ("open %s: %d: %s\n", argv[2], r, msg);
    if (r == 0)
      FAIL ("open %s succeeded, want -%s", argv[2], argv[3]);
    if (r != -want)
      FAIL ("open %s: %d, want -%s (%d)", argv[2], r, argv[3], want);
    for (i = 4; i < argc; i++)
      if (!strstr (msg, argv[i]))
        FAIL ("the message lacks \"%s\"", argv[i]);
    return 0;
  }
  fprintf (stderr, "usage: %s ops URL | put-get URL KEY TEXT | "
           "open-fails URL ERRNO TEXT...\n", argv[0]);
  return 2;
}
