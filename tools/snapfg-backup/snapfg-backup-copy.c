/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg-backup: the copy engine.
 *
 * Reads ranges of the snapshot and writes them into the image being
 * built, like nbdcopy: a fixed number of requests in flight (COPY_SLOTS),
 * spread over every source connection (several when the server allows
 * multi-conn), all driven by one poll loop through libnbd's aio calls.
 * Each slot reads a piece, checksums its blocks, then writes it (or, if
 * it is all zero, skips it in a new image or writes zeroes in an
 * overlay, where skipping would show the older image's data).
 *
 * The checksums (and, for an image written directly, the pwrite) are
 * done by a small pool of threads, not by the poll loop: SHA-256 of
 * every block is about half of the copy's CPU time, and done in the
 * loop it keeps the loop from reading while it hashes (measured: the
 * loop's thread was busy 87 % of a full backup).  The loop hands a
 * piece that was read to the pool and takes it back when it is hashed
 * (and written); only the loop touches libnbd.
 *
 * The engine never leaves a request in flight when it returns, even on
 * failure: nbdkit 1.32 (Debian 12) aborts when a client drops a
 * connection with replies still owed ("raw_send_socket: Assertion
 * 'sock >= 0'"), and a backup tool must not take the server down.
 */

#include <config.h>

#include <stdio.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>
#include <sys/eventfd.h>

#include <gnutls/gnutls.h>
#include <gnutls/crypto.h>

#include "big-buffer.h"
#include "snapfg-backup.h"

#define MAX_SLOTS 64            /* requests in flight, at most */
/* The defaults: 32 requests of 1 MiB.  With the hashing in the pool,
 * larger requests won (fewer requests for the server and the loop to
 * handle, fewer hand-offs to the pool): in paired rounds, 0.696-0.708 s
 * against 0.745-0.747 s for the former 64 x 256 KiB, with 16 x 2 MiB
 * as good and 32 x 512 KiB, 64 x 512 KiB, 64 x 1 MiB and 8 x 2 MiB in
 * between (BENCHMARKS.md).
 */
#define COPY_SLOTS 32           /* requests in flight by default */
#define PIECE_SIZE (1024 * 1024) /* bytes per request by default */
#define MAX_PIECE (4 << 20)     /* ... at most */
#define HASH_THREADS 2          /* the pool that hashes (and writes) */
#define MAX_POOL_THREADS 8      /* ... at most (copy_job.threads) */

/* The pieces are at most this many blocks (of at least 64K). */
#define MAX_PIECE_BLOCKS (MAX_PIECE / 65536)

enum slot_state {
  SLOT_IDLE,
  SLOT_READING,
  SLOT_READ_DONE,
  SLOT_HASHING,                 /* owned by the pool */
  SLOT_HASHED,                  /* back from it */
  SLOT_WRITING,
  SLOT_WRITE_DONE,
};

/* The reads of a piece at most (its requests: job->request is raised to
 * a piece / MAX_READS), and the source connections at most.
 */
#define MAX_READS 64
#define MAX_SOURCES 16

struct slot;
struct read_req {               /* one read of a piece: its completion */
  struct slot *s;
  unsigned src;                 /* on this source connection */
};

struct slot {
  enum slot_state state;
  uint64_t offset, length;
  size_t src;                   /* index of the source connection */
  int error;                    /* errno of the last request, 0 if none */
  int reads;                    /* reads of the piece not completed */
  int on_src[MAX_SOURCES];      /* ... of them, per source connection */
  struct read_req req[MAX_READS];
  int writes;                   /* writes of the piece not completed */
  char *buf;
  /* Filled by the pool. */
  bool zero[MAX_PIECE_BLOCKS];  /* which blocks are all zero */
  size_t nblocks;
  uint64_t written;             /* bytes written into a direct image */
  struct slot *next;            /* in the pool's list of finished slots */
};

/* --- SHA-256 (GnuTLS: libnbd links it already for TLS) --- */

int
sha256_buf (const void *buf, size_t len, unsigned char out[SHA256_LEN])
{
  return gnutls_hash_fast (GNUTLS_DIG_SHA256, buf, len, out) == 0 ? 0 : -1;
}

void
sha256_zero (uint64_t len, unsigned char out[SHA256_LEN])
{
  static const char zeroes[65536];
  gnutls_hash_hd_t h;

  if (gnutls_hash_init (&h, GNUTLS_DIG_SHA256) < 0)
    abort ();
  while (len > 0) {
    size_t n = len < sizeof zeroes ? len : sizeof zeroes;
    gnutls_hash (h, zeroes, n);
    len -= n;
  }
  gnutls_hash_deinit (h, out);
}

void
hex_digest (const unsigned char d[SHA256_LEN], char out[65])
{
  for (int i = 0; i < SHA256_LEN; ++i)
    sprintf (out + 2 * i, "%02x", d[i]);
}

static bool
is_zero (const char *buf, size_t len)
{
  return len == 0 || (buf[0] == 0 && memcmp (buf, buf + 1, len - 1) == 0);
}

/* --- completion callbacks: only record, the loop does the work --- */

static int
read_done (void *opaque, int *error)
{
  struct read_req *rq = opaque;
  struct slot *s = rq->s;

  if (s->on_src[rq->src] == 0)
    return 1;                   /* given up with its dead connection */
  s->on_src[rq->src]--;
  if (*error)
    s->error = *error;
  if (--s->reads == 0)
    s->state = SLOT_READ_DONE;
  return 1;
}

static int
write_done (void *opaque, int *error)
{
  struct slot *s = opaque;

  if (*error)
    s->error = *error;
  if (--s->writes == 0)
    s->state = SLOT_WRITE_DONE;
  return 1;
}

/* --- the engine --- */

struct cursor {
  size_t range;                 /* next range */
  uint64_t offset;              /* next offset in it */
};

/* The next piece to copy, or false when none is left. */
static bool
next_piece (const struct copy_job *job, struct cursor *c, uint64_t piece,
            uint64_t *off, uint64_t *len)
{
  while (c->range < job->nranges) {
    const struct copy_range *r = &job->ranges[c->range];
    uint64_t end = r->offset + r->length;

    if (end > job->size)
      end = job->size;
    if (c->offset < r->offset)
      c->offset = r->offset;
    if (c->offset >= end) {
      c->range++;
      continue;
    }
    *off = c->offset;
    /* Pieces stay aligned to the piece size, so that blocks never
     * straddle two of them.
     */
    *len = piece - c->offset % piece;
    if (*len > end - c->offset)
      *len = end - c->offset;
    c->offset += *len;
    return true;
  }
  return false;
}

/* Checksum each block of the piece just read and note which are zero. */
static size_t
scan_blocks (struct copy_job *job, const struct slot *s,
             const unsigned char *zero_sum, bool zero[MAX_PIECE_BLOCKS])
{
  size_t n = 0;

  for (uint64_t o = s->offset; o < s->offset + s->length; o += job->block) {
    uint64_t len = job->block;
    const char *p = s->buf + (o - s->offset);
    unsigned char *d = job->sums + (o / job->block) * SHA256_LEN;

    if (o + len > s->offset + s->length)
      len = s->offset + s->length - o;
    zero[n] = is_zero (p, len);
    if (zero[n] && len == job->block)
      memcpy (d, zero_sum, SHA256_LEN);
    else
      sha256_buf (p, len, d);
    n++;
  }
  return n;
}

/* A new plain full image written directly (in a pool thread): the runs
 * of data blocks into the file, at their clusters' places; zero runs
 * are skipped (a new image reads as zero already).  The result is in
 * s->error and s->written.
 */
static void
write_direct (struct copy_job *job, struct slot *s)
{
  for (size_t i = 0; i < s->nblocks; ) {
    size_t j = i + 1;
    uint64_t off, len;

    while (j < s->nblocks && s->zero[j] == s->zero[i])
      j++;
    off = s->offset + i * job->block;
    len = j * job->block < s->length ? j * job->block : s->length;
    len -= i * job->block;
    i = j;
    if (s->zero[j - 1])
      continue;
    if (direct_pwrite (job->direct, s->buf + (off - s->offset), len,
                       off) == -1) {
      s->error = errno;
      return;
    }
    s->written += len;
  }
}

/* --- the pool: hashing (and direct writes) off the poll loop --- */

struct pool {
  struct copy_job *job;
  const unsigned char *zero_sum;
  pthread_mutex_t lock;
  pthread_cond_t work;          /* a slot was queued, or quit was set */
  struct slot *queue[MAX_SLOTS]; /* to do, first in first out, so that
                                    the file is written in order */
  size_t head, queued;
  struct slot *done;            /* finished, for the loop */
  bool quit;
  int efd;                      /* readable when done was filled */
  pthread_t threads[MAX_POOL_THREADS];
  size_t nthreads;              /* 0: the loop hashes itself */
};

/* What the pool does with a slot. */
static void
pool_process (struct pool *p, struct slot *s)
{
  s->nblocks = scan_blocks (p->job, s, p->zero_sum, s->zero);
  s->written = 0;
  if (p->job->direct)
    write_direct (p->job, s);
  else if (p->job->sink)
    s->error = p->job->sink (p->job, s->offset, s->buf, s->length, s->zero,
                             s->nblocks, &s->written);
}

static void *
pool_thread (void *arg)
{
  struct pool *p = arg;
  struct slot *s;
  uint64_t one = 1;

  pthread_mutex_lock (&p->lock);
  for (;;) {
    while (p->queued == 0 && !p->quit)
      pthread_cond_wait (&p->work, &p->lock);
    if (p->queued == 0)
      break;
    s = p->queue[p->head];
    p->head = (p->head + 1) % MAX_SLOTS;
    p->queued--;
    pthread_mutex_unlock (&p->lock);

    pool_process (p, s);

    pthread_mutex_lock (&p->lock);
    /* The loop takes the whole list at once: wake it only for the
     * first slot of a new one.
     */
    if (p->done == NULL &&
        write (p->efd, &one, sizeof one) != sizeof one)
      abort ();               /* an eventfd write cannot fail */
    s->next = p->done;
    p->done = s;
  }
  pthread_mutex_unlock (&p->lock);
  return NULL;
}

/* Start the pool; with no thread (none could start), the loop hashes. */
static void
pool_start (struct pool *p, struct copy_job *job,
            const unsigned char *zero_sum)
{
  memset (p, 0, sizeof *p);
  p->job = job;
  p->zero_sum = zero_sum;
  pthread_mutex_init (&p->lock, NULL);
  pthread_cond_init (&p->work, NULL);
  p->efd = eventfd (0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (p->efd == -1)
    return;
  for (size_t i = 0; i < (job->threads ? job->threads : HASH_THREADS) &&
         i < MAX_POOL_THREADS; ++i)
    if (pthread_create (&p->threads[p->nthreads], NULL, pool_thread, p) == 0)
      p->nthreads++;
}

/* Hand S (just read) to the pool: SLOT_HASHING, or SLOT_HASHED at once
 * without threads.
 */
static void
pool_submit (struct pool *p, struct slot *s)
{
  if (p->nthreads == 0) {
    pool_process (p, s);
    s->state = SLOT_HASHED;
    return;
  }
  s->state = SLOT_HASHING;
  pthread_mutex_lock (&p->lock);
  p->queue[(p->head + p->queued) % MAX_SLOTS] = s;
  p->queued++;
  pthread_cond_signal (&p->work);
  pthread_mutex_unlock (&p->lock);
}

/* The slots the pool finished are SLOT_HASHED again. */
static void
pool_collect (struct pool *p)
{
  struct slot *s;
  uint64_t n;

  if (p->nthreads == 0)
    return;
  if (read (p->efd, &n, sizeof n) == -1 && errno != EAGAIN)
    abort ();
  pthread_mutex_lock (&p->lock);
  s = p->done;
  p->done = NULL;
  pthread_mutex_unlock (&p->lock);
  for (; s; s = s->next)
    s->state = SLOT_HASHED;
}

/* Stop the threads; the loop has none of its slots in the pool then. */
static void
pool_stop (struct pool *p)
{
  pthread_mutex_lock (&p->lock);
  p->quit = true;
  pthread_cond_broadcast (&p->work);
  pthread_mutex_unlock (&p->lock);
  for (size_t i = 0; i < p->nthreads; ++i)
    pthread_join (p->threads[i], NULL);
  if (p->efd >= 0)
    close (p->efd);
  pthread_mutex_destroy (&p->lock);
  pthread_cond_destroy (&p->work);
}

/* Write the piece through NBD (in the loop): runs of data blocks as
 * data, runs of zero blocks as zeroes in an overlay (skipping them
 * would show the older image) or not at all in a new image (it reads
 * as zero already).  Returns -1 if a write could not be issued (the
 * others still complete).
 */
static int
write_piece (struct copy_job *job, struct slot *s, const bool *zero,
             size_t nblocks)
{
  int r = 0;

  s->writes = 1;                /* held until every write is issued */
  for (size_t i = 0; i < nblocks && r == 0; ) {
    size_t j = i + 1;
    uint64_t off, len;
    int64_t c;

    while (j < nblocks && zero[j] == zero[i])
      j++;
    off = s->offset + i * job->block;
    len = j * job->block < s->length ? j * job->block : s->length;
    len -= i * job->block;
    i = j;
    if (zero[j - 1] && !job->write_zeroes)
      continue;
    s->writes++;
    if (zero[j - 1])
      c = nbd_aio_zero (job->dst, len, off,
                        (nbd_completion_callback) { .callback = write_done,
                                                    .user_data = s }, 0);
    else
      c = nbd_aio_pwrite (job->dst, s->buf + (off - s->offset), len, off,
                          (nbd_completion_callback) { .callback = write_done,
                                                      .user_data = s }, 0);
    if (c == -1) {
      s->writes--;
      r = -1;
    }
    else if (zero[j - 1])
      job->bytes_zeroed += len;
    else
      job->bytes_written += len;
  }
  if (--s->writes == 0)
    s->state = SLOT_WRITE_DONE;
  return r;
}

/* One copy_run: its slots, connections and progress. */
struct copier {
  struct copy_job *job;
  struct slot *slots;
  int nslots;
  char *bufs;                   /* the slots' buffers, one mapping */
  uint64_t stride;              /* from one slot's buffer to the next */
  size_t bufs_len;
  uint64_t piece;
  uint64_t request;             /* bytes per read request, at most */
  struct cursor cur;
  struct pool pool;
  unsigned char zero_sum[SHA256_LEN];
  struct nbd_handle *hs[17];    /* the sources, then the image */
  bool dead[17];
  struct pollfd fds[18];
  size_t nh;
  int in_flight;
  uint64_t total, done;
  bool stopping, failed;
  char *err;
  size_t err_len;
  struct tool_progress prog;
  /* --limit-rate's token bucket: bytes that may be read now, refilled
   * at job->rate a second up to a tenth of a second's worth, or one
   * piece if that is more.  A piece starts only once the bucket holds
   * all of it (need: the next piece's length), so a copy of n bytes
   * takes at least n / rate less one bucket.  (Charging a piece as soon
   * as the bucket was above zero let the last piece go unpaid: a 4 MiB
   * copy at 1 MiB/s in pieces of 1 MiB took 3.2 s.)
   */
  double tokens, tokens_at;
  uint64_t need;
};

/* Refill the bucket; may a read of LENGTH bytes start now? */
static bool
copier_may_read (struct copier *c, uint64_t length)
{
  double now, cap;

  if (c->job->rate == 0)
    return true;
  now = tool_now ();
  cap = c->job->rate / 10.0;
  if (cap < (double) length)
    cap = length;
  c->tokens += (now - c->tokens_at) * c->job->rate;
  if (c->tokens > cap)
    c->tokens = cap;
  c->tokens_at = now;
  c->need = length;
  return c->tokens >= (double) length;
}

/* Milliseconds until the bucket lets the next read start (0: now). */
static int
copier_rate_wait_ms (struct copier *c)
{
  if (c->job->rate == 0 || copier_may_read (c, c->need))
    return 0;
  return (int) ((c->need - c->tokens) * 1000.0 / c->job->rate) + 1;
}

/* The first failure is the one reported; the copy stops issuing. */
static void __attribute__ ((format (printf, 2, 3)))
copier_fail (struct copier *c, const char *fmt, ...)
{
  va_list ap;

  if (!c->failed) {
    va_start (ap, fmt);
    vsnprintf (c->err, c->err_len, fmt, ap);
    va_end (ap);
  }
  c->failed = c->stopping = true;
}

/* Sizes, buffers and connections; -1 with the reason in err. */
static int
copier_start (struct copier *c)
{
  struct copy_job *job = c->job;

  if (c->nslots < 1 || c->nslots > MAX_SLOTS)
    c->nslots = COPY_SLOTS;
  /* A piece is whole blocks, and at most MAX_PIECE_BLOCKS of them. */
  if (c->piece < job->block)
    c->piece = job->block;
  c->piece = c->piece / job->block * job->block;
  if (c->piece / job->block > MAX_PIECE_BLOCKS)
    c->piece = job->block * MAX_PIECE_BLOCKS;
  c->request = job->request && job->request < c->piece
    ? job->request : c->piece;
  if (c->request < (c->piece + MAX_READS - 1) / MAX_READS)
    c->request = (c->piece + MAX_READS - 1) / MAX_READS;
  if (job->nsrc == 0 || job->nsrc > MAX_SOURCES) {
    snprintf (c->err, c->err_len, "internal error: %zu source connections",
              job->nsrc);
    return -1;
  }
  for (size_t i = 0; i < job->nranges; ++i)
    c->total += job->ranges[i].length;
  sha256_zero (job->block, c->zero_sum);
  tool_progress_start (&c->prog, job->what);
  memset (c->slots, 0, MAX_SLOTS * sizeof *c->slots);
  /* Every slot's buffer in one mapping, in huge pages where the kernel
   * gives them (big-buffer.h): 4 KiB pages cost a fault each at the
   * first read into them, most of a run's faults.
   */
  if (job->headroom > COPY_MAX_HEADROOM) {
    snprintf (c->err, c->err_len, "internal error: %zu bytes of headroom",
              job->headroom);
    return -1;
  }
  /* With headroom each slot starts on a 4096-byte boundary and its
   * data headroom bytes after it.
   */
  c->stride = job->headroom ? (job->headroom + c->piece + 4095) / 4096 * 4096
    : c->piece;
  c->bufs_len = c->nslots * c->stride;
  c->bufs = big_alloc (c->bufs_len);
  if (c->bufs == NULL) {
    snprintf (c->err, c->err_len, "out of memory (%d buffers of %" PRIu64
              " bytes)", c->nslots, c->piece);
    return -1;
  }
  for (int i = 0; i < c->nslots; ++i) {
    c->slots[i].buf = c->bufs + i * c->stride + job->headroom;
    c->slots[i].src = i % job->nsrc;
  }
  for (size_t i = 0; i < job->nsrc; ++i) {
    /* libnbd zeroes a read's buffer first, by default, so that a short
     * reply cannot show old memory: a tenth of the copy's CPU time.
     * The buffers are the copy's own, and a piece whose read fails is
     * never used, so it is not needed here.
     */
    nbd_set_pread_initialize (job->src[i], false);
    c->hs[c->nh++] = job->src[i];
  }
  if (job->dst)
    c->hs[c->nh++] = job->dst;
  pool_start (&c->pool, job, c->zero_sum);
  return 0;
}

/* Read slot S's piece in requests of at most c->request bytes: a large
 * request costs the server more than its bytes (measured with nbdkit
 * 1.32: 4 MiB requests took 2 to 4 times the server's CPU time of 256
 * KiB ones for the same data).  s->reads is held at one until every
 * request is issued.  The requests of a piece go round the connections:
 * each connection's queue then holds the oldest piece first, so that
 * pieces complete one after another (and are hashed and stored while the
 * next ones are read) rather than all at once at the end.
 */
static void
copier_read_piece (struct copier *c, struct slot *s)
{
  struct copy_job *job = c->job;

  s->reads = 1;
  for (uint64_t o = 0, k = 0; o < s->length; o += c->request, ++k) {
    uint64_t n = s->length - o < c->request ? s->length - o : c->request;
    size_t src = (s->src + k) % job->nsrc;

    s->req[k] = (struct read_req) { .s = s, .src = src };
    s->reads++;
    s->on_src[src]++;
    if (nbd_aio_pread (job->src[src], s->buf + o, n, s->offset + o,
                       (nbd_completion_callback) {
                         .callback = read_done, .user_data = &s->req[k] },
                       0) == -1) {
      s->reads--;
      s->on_src[src]--;
      if (!s->error)
        s->error = nbd_get_errno () ? nbd_get_errno () : EIO;
      copier_fail (c, "reading offset %" PRIu64 ": %s", s->offset + o,
                   nbd_get_error ());
      break;
    }
  }
  if (--s->reads == 0)
    s->state = SLOT_READ_DONE;
}

/* Start reads on idle slots. */
static void
copier_issue_reads (struct copier *c)
{
  for (int i = 0; i < c->nslots && !c->stopping; ++i) {
    struct slot *s = &c->slots[i];
    if (s->state != SLOT_IDLE)
      continue;
    struct cursor next = c->cur;
    if (!next_piece (c->job, &next, c->piece, &s->offset, &s->length))
      break;
    if (!copier_may_read (c, s->length))
      break;                    /* the rate limit: later */
    c->cur = next;
    if (c->job->rate)
      c->tokens -= s->length;
    s->error = 0;
    s->state = SLOT_READING;
    c->in_flight++;
    copier_read_piece (c, s);
  }
}

/* Slot S moves on: a finished read to the pool, a hashed piece to be
 * written (a direct image's is written already), a written one idle.
 */
static void
copier_advance (struct copier *c, struct slot *s)
{
  struct copy_job *job = c->job;

  if (s->state == SLOT_READ_DONE) {
    if (s->error) {
      copier_fail (c, "reading offset %" PRIu64 " (%" PRIu64 " bytes): %s",
                   s->offset, s->length, strerror (s->error));
      s->state = SLOT_IDLE;
      c->in_flight--;
      return;
    }
    job->bytes_read += s->length;
    s->error = 0;
    pool_submit (&c->pool, s);
  }
  if (s->state == SLOT_HASHED) {
    if (job->direct || job->sink) {
      job->bytes_written += s->written;
      s->state = SLOT_WRITE_DONE;
    }
    else if (job->dst == NULL || c->failed) {
      s->state = SLOT_IDLE;
      c->in_flight--;
      c->done += s->length;
      return;
    }
    else {
      s->state = SLOT_WRITING;
      if (write_piece (job, s, s->zero, s->nblocks) == -1)
        copier_fail (c, "writing the image at offset %" PRIu64 ": %s",
                     s->offset, nbd_get_error ());
    }
  }
  if (s->state == SLOT_WRITE_DONE) {
    if (s->error)
      copier_fail (c, "%s at offset %" PRIu64 ": %s",
                   job->sink ? "storing the chunk" : "writing the image",
                   s->offset, strerror (s->error));
    s->state = SLOT_IDLE;
    c->in_flight--;
    c->done += s->length;
  }
}

/* Nothing in flight: is there more to read?  (Not when stopping.) */
static bool
copier_more_to_do (struct copier *c)
{
  if (c->stopping)
    return false;
  for (int i = 0; i < c->nslots; ++i)
    if (c->slots[i].state == SLOT_IDLE) {
      struct cursor probe = c->cur;
      uint64_t o, l;
      return next_piece (c->job, &probe, c->piece, &o, &l);
    }
  return false;
}

/* A completion may have come in while requests were issued. */
static bool
copier_slot_ready (struct copier *c)
{
  for (int i = 0; i < c->nslots; ++i)
    if (c->slots[i].state == SLOT_READ_DONE ||
        c->slots[i].state == SLOT_HASHED ||
        c->slots[i].state == SLOT_WRITE_DONE)
      return true;
  return false;
}

/* Connection I is dead: it completes nothing more, so give up on its
 * requests, there is no reply left to wait for.
 */
static void
copier_lost (struct copier *c, size_t i)
{
  struct copy_job *job = c->job;

  copier_fail (c, "%s: %s", c->hs[i] == job->dst ? "the image's qemu-nbd"
               : "the NBD server", nbd_get_error () ? nbd_get_error ()
               : "connection lost");
  for (int j = 0; j < c->nslots; ++j) {
    struct slot *s = &c->slots[j];

    if (s->state == SLOT_READING && i < job->nsrc && s->on_src[i]) {
      /* Its reads on the other connections still complete: the piece
       * fails once they have.
       */
      s->reads -= s->on_src[i];
      s->on_src[i] = 0;
      if (!s->error)
        s->error = ENOTCONN;
      if (s->reads == 0)
        s->state = SLOT_READ_DONE;
    }
    else if (s->state == SLOT_WRITING && c->hs[i] == job->dst) {
      s->state = SLOT_IDLE;
      c->in_flight--;
    }
  }
  c->dead[i] = true;
}

/* Wait for the connections and the pool, and let libnbd read or write
 * what they are ready for.  -1: poll failed (the loop ends).
 */
static int
copier_wait (struct copier *c)
{
  for (size_t i = 0; i < c->nh; ++i) {
    unsigned dir = c->dead[i] ? 0 : nbd_aio_get_direction (c->hs[i]);
    c->fds[i].fd = c->dead[i] ? -1 : nbd_aio_get_fd (c->hs[i]);
    c->fds[i].events = 0;
    c->fds[i].revents = 0;
    if (dir & LIBNBD_AIO_DIRECTION_READ)
      c->fds[i].events |= POLLIN;
    if (dir & LIBNBD_AIO_DIRECTION_WRITE)
      c->fds[i].events |= POLLOUT;
  }
  /* ... and for the pool (fd -1 without threads: ignored). */
  c->fds[c->nh].fd = c->pool.nthreads ? c->pool.efd : -1;
  c->fds[c->nh].events = POLLIN;
  c->fds[c->nh].revents = 0;
  int wait_ms = copier_rate_wait_ms (c);

  if (wait_ms == 0 || wait_ms > 500)
    wait_ms = 500;
  if (poll (c->fds, c->nh + 1, wait_ms) == -1) {
    if (errno == EINTR)
      return 0;
    copier_fail (c, "poll: %s", strerror (errno));
    return -1;
  }
  for (size_t i = 0; i < c->nh; ++i) {
    int r = 0;
    if (c->dead[i])
      continue;
    if (c->fds[i].revents & (POLLIN | POLLHUP | POLLERR))
      r = nbd_aio_notify_read (c->hs[i]);
    else if (c->fds[i].revents & POLLOUT)
      r = nbd_aio_notify_write (c->hs[i]);
    if (r == -1 || nbd_aio_is_dead (c->hs[i]))
      copier_lost (c, i);
  }
  return 0;
}

/* The poll loop: until every range is copied or the copy stops, with
 * nothing in flight when it returns.
 */
static void
copier_loop (struct copier *c)
{
  struct copy_job *job = c->job;

  for (;;) {
    copier_issue_reads (c);
    pool_collect (&c->pool);
    for (int i = 0; i < c->nslots; ++i)
      copier_advance (c, &c->slots[i]);

    tool_progress_update (&c->prog, c->done, c->total);
    if (!c->stopping && backup_interrupted)
      copier_fail (c, "interrupted");
    if (!c->stopping && job->stop_after && c->done >= job->stop_after)
      c->stopping = true;

    if (c->in_flight == 0) {
      int wait_ms;

      if (!copier_more_to_do (c))
        break;
      /* Nothing in flight because of the rate limit: sleep for it. */
      wait_ms = c->stopping ? 0 : copier_rate_wait_ms (c);
      if (wait_ms > 0)
        poll (NULL, 0, wait_ms > 500 ? 500 : wait_ms);
      continue;
    }
    if (copier_slot_ready (c))
      continue;
    if (copier_wait (c) == -1)
      break;
  }
}

int
copy_run (struct copy_job *job, char *err, size_t err_len)
{
  /* Static, not on the stack: should libnbd ever complete a command
   * while a handle is closed after a failure, its callback still finds
   * its slot.  copy_run is not reentrant.
   */
  static struct slot slots[MAX_SLOTS];
  static struct copier c;

  memset (&c, 0, sizeof c);
  c.job = job;
  c.slots = slots;
  c.nslots = job->slots ? (int) job->slots : COPY_SLOTS;
  c.piece = job->piece ? job->piece : PIECE_SIZE;
  c.tokens_at = tool_now ();
  c.err = err;
  c.err_len = err_len;
  err[0] = '\0';
  if (copier_start (&c) == -1)
    return -1;
  copier_loop (&c);
  pool_stop (&c.pool);
  tool_progress_end (&c.prog, c.done, c.total);

  if (!c.failed && job->stop_after && c.done >= job->stop_after) {
    /* Test hook: nothing is in flight now; wait here to be killed. */
    tool_info ("stopped after %" PRIu64 " bytes "
               "(SNAPFG_BACKUP_TEST_STOP_AFTER)", c.done);
    raise (SIGSTOP);
    snprintf (err, err_len, "stopped by SNAPFG_BACKUP_TEST_STOP_AFTER");
    c.failed = true;
  }
  big_free (c.bufs, c.bufs_len);
  return c.failed ? -1 : 0;
}
