/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg repository: the S3 back end.
 *
 * Objects live in one bucket under an optional prefix (s3://BUCKET/PREFIX),
 * addressed path-style (ENDPOINT/BUCKET/KEY): Ceph's RADOS Gateway and
 * MinIO need no DNS name per bucket that way, and AWS accepts it too.
 * Requests are signed with AWS Signature V4 by libcurl itself
 * (CURLOPT_AWS_SIGV4); the payload's SHA-256 is sent and signed as
 * x-amz-content-sha256, so the gateway refuses a body damaged on the way.
 *
 * The operations:
 *   put       PUT; with if_absent, "If-None-Match: *" makes the gateway
 *             refuse (412) to replace an existing object, atomically.
 *   get/head  GET/HEAD; 404 NoSuchKey (HEAD: 404) is -ENOENT.
 *   touch     a copy of the object onto itself with
 *             x-amz-metadata-directive: REPLACE, which gives it a new
 *             Last-Modified (S3 has no other way to set it).
 *   del       HEAD, then DELETE: S3's DELETE answers 204 whether or not
 *             there was an object, and the interface promises -ENOENT.
 *   list      ListObjectsV2 pages of up to 1000 keys, following the
 *             continuation token.
 *
 * Threads: the repository reads chunks from several threads.  A curl
 * handle is not thread-safe, so each request borrows one from a small
 * pool under a mutex and returns it afterwards.  Over HTTPS handles keep
 * their connections, so a thread's next request reuses a warm one; over
 * plain HTTP each request opens its own (see perform_once: a reused
 * connection was 40 ms slower per request with radosgw).
 *
 * SNAPFG_S3_TRACE=1 prints one line per request on stderr.
 *
 * Failures are retried with exponential backoff when they may pass:
 * connection failures, timeouts, HTTP 5xx and 429/SlowDown.  A retried
 * conditional put that then meets 412 may be meeting its own earlier
 * attempt (whose reply was lost): it compares the stored object with its
 * own bytes and, if they are equal, succeeds.
 */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

/* libcurl's calls go through repo-curl.h's table (loaded on first use):
 * its type-checking macros would stand in the way of the table's.
 */
#define CURL_DISABLE_TYPECHECK 1
#define REPO_CURL_CALLS 1
#include <curl/curl.h>
#include "repo-curl.h"
#include <gnutls/crypto.h>
#include <gnutls/gnutls.h>

#include "cleanup.h"
#include "vector.h"
#include "snapfg-error.h"
#include "repo-store.h"
#include "repo-s3-config.h"
#include "s3-xml.h"

DEFINE_VECTOR_TYPE (s3_bytes, char);

/* Attempts per request, and the first backoff (doubling each time):
 * 0.1 + 0.2 + 0.4 + 0.8 + 1.6 s, about 3 s in all, covers a gateway
 * restart's refused connections without hanging a run on a dead one.
 */
#define S3_ATTEMPTS 6
#define S3_FIRST_BACKOFF_MS 100

/* SHA-256 of the empty string: the payload hash of GET, HEAD, DELETE. */
#define EMPTY_SHA256 \
  "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

struct s3_store {
  struct repo_store base;       /* first: a repo_store * is an s3_store * */
  char *endpoint;               /* "http://127.0.0.1:8080", no '/' at end */
  char *bucket;
  char *prefix;                 /* "" or "PREFIX/" */
  char *sigv4;                  /* "aws:amz:REGION:s3" */
  bool fresh_connections;       /* plain http: one connection a request */
  struct repo_s3_credentials cred;

  pthread_mutex_t lock;         /* protects the idle handles */
  CURL **idle;
  size_t n_idle, cap_idle;
};

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_result;
static char curl_load_error[512];   /* libcurl could not be loaded */

/* SNAPFG_S3_TRACE=1: one line on stderr per request (method, key,
 * status, bytes, time), for finding out what a command asks of a store.
 */
static bool s3_trace;

static void
curl_init_once (void)
{
  const char *t = getenv ("SNAPFG_S3_TRACE");

  s3_trace = t && *t && strcmp (t, "0") != 0;
  if (repo_curl_load (curl_load_error, sizeof curl_load_error) == -1) {
    curl_init_result = CURLE_FAILED_INIT;
    return;
  }
  curl_init_result = curl_global_init (CURL_GLOBAL_DEFAULT);
}

/* --- handles --------------------------------------------------------- */

static CURL *
borrow_handle (struct s3_store *s)
{
  CURL *h = NULL;

  pthread_mutex_lock (&s->lock);
  if (s->n_idle > 0)
    h = s->idle[--s->n_idle];
  pthread_mutex_unlock (&s->lock);
  if (h == NULL)
    h = curl_easy_init ();
  return h;
}

/* Keep it for the next request; the pool grows to the number of threads
 * that ever ran requests at once, which the caller's thread count bounds.
 */
static void
return_handle (struct s3_store *s, CURL *h)
{
  pthread_mutex_lock (&s->lock);
  if (s->n_idle == s->cap_idle) {
    size_t cap = s->cap_idle ? s->cap_idle * 2 : 8;
    CURL **p = realloc (s->idle, cap * sizeof *p);

    if (p == NULL) {
      pthread_mutex_unlock (&s->lock);
      curl_easy_cleanup (h);
      return;
    }
    s->idle = p;
    s->cap_idle = cap;
  }
  s->idle[s->n_idle++] = h;
  pthread_mutex_unlock (&s->lock);
}

/* --- one request ----------------------------------------------------- */

struct s3_request {
  const char *method;           /* "GET", "PUT", "HEAD", "DELETE" */
  const char *key;              /* full object key (prefix included), or
                                 * NULL for the bucket */
  const char *query;            /* canonical query string or NULL */
  const void *body;             /* PUT's payload */
  size_t body_len;
  const char *if_none_match;    /* "*" or NULL */
  const char *copy_source;      /* "/bucket/key" or NULL */
};

struct s3_response {
  long status;                  /* 0: no HTTP reply */
  s3_bytes body;
  uint64_t content_length;
  bool have_length;
  int64_t last_modified;        /* -1 if not sent */
  char curl_error[CURL_ERROR_SIZE];
  CURLcode cc;
};

struct upload {
  const char *buf;
  size_t len, pos;
};

static size_t
read_cb (char *dst, size_t size, size_t nmemb, void *opaque)
{
  struct upload *u = opaque;
  size_t n = size * nmemb;

  if (n > u->len - u->pos)
    n = u->len - u->pos;
  memcpy (dst, u->buf + u->pos, n);
  u->pos += n;
  return n;
}

/* curl rewinds the upload when it must send it again (a redirect, a
 * connection that died before the reply).
 */
static int
seek_cb (void *opaque, curl_off_t offset, int origin)
{
  struct upload *u = opaque;

  if (origin != SEEK_SET || offset < 0 || (uint64_t) offset > u->len)
    return CURL_SEEKFUNC_FAIL;
  u->pos = offset;
  return CURL_SEEKFUNC_OK;
}

/* Bodies come in pieces of 16 KiB or so: room for all of it at the
 * first one (as the length header says, up to a bound a hostile reply
 * cannot push us past) saves copying a 4 MiB chunk a dozen times.
 */
#define S3_RESERVE_MAX (64 << 20)

static size_t
write_cb (char *data, size_t size, size_t nmemb, void *opaque)
{
  struct s3_response *resp = opaque;
  size_t n = size * nmemb;

  if (resp->body.cap == 0 && resp->have_length
      && resp->content_length > n && resp->content_length <= S3_RESERVE_MAX)
    s3_bytes_reserve (&resp->body, resp->content_length);
  if (s3_bytes_append_n (&resp->body, data, n) < 0)
    return 0;                   /* curl fails the transfer: CURLE_WRITE_ERROR */
  return n;
}

static size_t
header_cb (char *data, size_t size, size_t nmemb, void *opaque)
{
  struct s3_response *resp = opaque;
  size_t n = size * nmemb;
  char line[256], *colon, *value, *end;

  if (n >= sizeof line)
    return n;                   /* none of the headers we read is that long */
  memcpy (line, data, n);
  line[n] = '\0';
  /* A new status line (after a 100 Continue or a redirect) starts over. */
  if (strncmp (line, "HTTP/", 5) == 0) {
    resp->have_length = false;
    resp->last_modified = -1;
    return n;
  }
  colon = strchr (line, ':');
  if (colon == NULL)
    return n;
  *colon = '\0';
  value = colon + 1;
  while (*value == ' ' || *value == '\t')
    value++;
  end = value + strlen (value);
  while (end > value && (end[-1] == '\r' || end[-1] == '\n' || end[-1] == ' '))
    *--end = '\0';
  if (strcasecmp (line, "Content-Length") == 0) {
    char *e;
    errno = 0;
    resp->content_length = strtoull (value, &e, 10);
    resp->have_length = errno == 0 && e != value && *e == '\0';
  }
  else if (strcasecmp (line, "Last-Modified") == 0)
    resp->last_modified = s3_parse_http_date (value);
  return n;
}

static int
sha256_hex (const void *buf, size_t len, char hex[65])
{
  unsigned char d[32];
  int i;

  if (gnutls_hash_fast (GNUTLS_DIG_SHA256, buf, len, d) < 0)
    return -1;
  for (i = 0; i < 32; i++)
    sprintf (hex + 2 * i, "%02x", d[i]);
  return 0;
}

/* Append "name: value" to the request's headers. */
static bool
add_header (struct curl_slist **list, const char *name, const char *value)
{
  char h[512];
  struct curl_slist *l;

  if (snprintf (h, sizeof h, "%s:%s%s", name, *value ? " " : "", value)
      >= (int) sizeof h)
    return false;
  l = curl_slist_append (*list, h);
  if (l == NULL)
    return false;
  *list = l;
  return true;
}

/* One attempt.  Returns 0 when an HTTP reply came (any status), -1 when
 * none did (resp->cc and resp->curl_error say why), -ENOMEM.
 */
static int
perform_once (struct s3_store *s, CURL *h, const struct s3_request *rq,
              const char *payload_hash, struct s3_response *resp)
{
  CLEANUP_FREE char *url = NULL;
  struct curl_slist *headers = NULL;
  struct upload up = { .buf = rq->body, .len = rq->body_len };
  bool ok = true;
  int r;

  s3_bytes_clear (&resp->body);
  resp->status = 0;
  resp->have_length = false;
  resp->last_modified = -1;
  resp->curl_error[0] = '\0';

  if (asprintf (&url, "%s/%s%s%s%s%s", s->endpoint, s->bucket,
                rq->key ? "/" : "", rq->key ? rq->key : "",
                rq->query ? "?" : "", rq->query ? rq->query : "") < 0) {
    url = NULL;
    return -ENOMEM;
  }

  /* Back to defaults, keeping the live connections and DNS cache. */
  curl_easy_reset (h);
  ok &= add_header (&headers, "x-amz-content-sha256", payload_hash);
  /* No "Expect:" header to turn off curl's 100-continue: curl 7.88 signs
   * the empty header it then does not send, and every request fails
   * with SignatureDoesNotMatch.  Gateways answer 100 Continue at once.
   */
  if (rq->if_none_match)
    ok &= add_header (&headers, "If-None-Match", rq->if_none_match);
  if (rq->copy_source) {
    ok &= add_header (&headers, "x-amz-copy-source", rq->copy_source);
    ok &= add_header (&headers, "x-amz-metadata-directive", "REPLACE");
  }
  if (s->cred.session_token)
    ok &= add_header (&headers, "x-amz-security-token",
                      s->cred.session_token);
  if (!ok) {
    curl_slist_free_all (headers);
    return -ENOMEM;
  }

  curl_easy_setopt (h, CURLOPT_URL, url);
  curl_easy_setopt (h, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt (h, CURLOPT_AWS_SIGV4, s->sigv4);
  curl_easy_setopt (h, CURLOPT_USERNAME, s->cred.access_key_id);
  curl_easy_setopt (h, CURLOPT_PASSWORD, s->cred.secret_access_key);
  curl_easy_setopt (h, CURLOPT_ERRORBUFFER, resp->curl_error);
  curl_easy_setopt (h, CURLOPT_NOSIGNAL, 1L);
  /* A new TCP connection per request over plain HTTP: on a reused one,
   * Ceph's radosgw (16.2) answered each request 40 ms late (a delayed
   * ACK meeting its Nagle-delayed reply body; quick ACKs on our side did
   * not help), while a connection costs a round trip on the local
   * network.  Over HTTPS the TLS handshake costs more: reuse there.
   */
  if (s->fresh_connections)
    curl_easy_setopt (h, CURLOPT_FORBID_REUSE, 1L);
  curl_easy_setopt (h, CURLOPT_CONNECTTIMEOUT, 10L);
  /* A transfer that moves nothing for a minute is dead. */
  curl_easy_setopt (h, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt (h, CURLOPT_LOW_SPEED_TIME, 60L);
  curl_easy_setopt (h, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt (h, CURLOPT_WRITEFUNCTION, write_cb);
  curl_easy_setopt (h, CURLOPT_WRITEDATA, resp);
  curl_easy_setopt (h, CURLOPT_HEADERFUNCTION, header_cb);
  curl_easy_setopt (h, CURLOPT_HEADERDATA, resp);

  if (strcmp (rq->method, "PUT") == 0) {
    curl_easy_setopt (h, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt (h, CURLOPT_READFUNCTION, read_cb);
    curl_easy_setopt (h, CURLOPT_READDATA, &up);
    curl_easy_setopt (h, CURLOPT_SEEKFUNCTION, seek_cb);
    curl_easy_setopt (h, CURLOPT_SEEKDATA, &up);
    curl_easy_setopt (h, CURLOPT_INFILESIZE_LARGE, (curl_off_t) rq->body_len);
  }
  else if (strcmp (rq->method, "HEAD") == 0)
    curl_easy_setopt (h, CURLOPT_NOBODY, 1L);
  else if (strcmp (rq->method, "GET") != 0)
    curl_easy_setopt (h, CURLOPT_CUSTOMREQUEST, rq->method);

  resp->cc = curl_easy_perform (h);
  if (resp->cc == CURLE_OK) {
    curl_easy_getinfo (h, CURLINFO_RESPONSE_CODE, &resp->status);
    r = 0;
  }
  else if (resp->cc == CURLE_WRITE_ERROR || resp->cc == CURLE_OUT_OF_MEMORY)
    r = -ENOMEM;
  else
    r = -1;
  /* Unhook our stack from the handle before it goes back to the pool. */
  curl_easy_setopt (h, CURLOPT_HTTPHEADER, NULL);
  curl_easy_setopt (h, CURLOPT_ERRORBUFFER, NULL);
  curl_slist_free_all (headers);
  if (resp->curl_error[0] == '\0' && resp->cc != CURLE_OK)
    snprintf (resp->curl_error, sizeof resp->curl_error, "%s",
              curl_easy_strerror (resp->cc));
  return r;
}

/* Is this reply worth another attempt? */
static bool
transient (int r, const struct s3_response *resp)
{
  if (r == -1)
    switch (resp->cc) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_SSL_CONNECT_ERROR:
      return true;
    default:
      return false;
    }
  /* 501 Not Implemented and 505 will say the same next time. */
  return r == 0 && ((resp->status >= 500 && resp->status != 501
                     && resp->status != 505)
                    || resp->status == 429);
}

static void
backoff (int attempt)
{
  long ms = S3_FIRST_BACKOFF_MS << (attempt < 10 ? attempt : 10);
  struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };

  while (nanosleep (&ts, &ts) < 0 && errno == EINTR)
    ;
}

/* Run rq, retrying what may pass.  *attempts is how many were made.
 * Returns 0 with an HTTP reply in resp (which may be an error status),
 * or a negative errno with the thread's error set (no reply at all).
 */
static int
perform (struct s3_store *s, const struct s3_request *rq,
         struct s3_response *resp, int *attempts)
{
  char hash[65];
  CURL *h;
  int r = -1, i;

  if (rq->body_len > 0) {
    if (sha256_hex (rq->body, rq->body_len, hash) < 0)
      return snapfg_set_error (EIO, "%s: SHA-256 of the payload failed",
                               s->base.location);
  }
  else
    strcpy (hash, EMPTY_SHA256);

  h = borrow_handle (s);
  if (h == NULL)
    return snapfg_set_error (ENOMEM, "%s: cannot make a curl handle",
                             s->base.location);
  for (i = 0; i < S3_ATTEMPTS; i++) {
    struct timespec t0, t1;

    if (i > 0)
      backoff (i - 1);
    clock_gettime (CLOCK_MONOTONIC, &t0);
    r = perform_once (s, h, rq, hash, resp);
    if (s3_trace) {
      clock_gettime (CLOCK_MONOTONIC, &t1);
      fprintf (stderr, "snapfg s3: %s /%s/%s%s%s: %ld%s%s, %zu bytes, "
               "%.1f ms\n", rq->method, s->bucket, rq->key ? rq->key : "",
               rq->query ? "?" : "", rq->query ? rq->query : "",
               resp->status, r == -1 ? " " : "",
               r == -1 ? resp->curl_error : "",
               rq->body_len + resp->body.len,
               (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6);
    }
    if (r == -ENOMEM || !transient (r, resp))
      break;
  }
  *attempts = i < S3_ATTEMPTS ? i + 1 : S3_ATTEMPTS;
  return_handle (s, h);

  if (r == -ENOMEM)
    return snapfg_set_error (ENOMEM, "%s: out of memory in an S3 request",
                             s->base.location);
  if (r == -1) {
    int err = resp->cc == CURLE_COULDNT_CONNECT ? ECONNREFUSED
      : resp->cc == CURLE_COULDNT_RESOLVE_HOST ? EHOSTUNREACH
      : resp->cc == CURLE_OPERATION_TIMEDOUT ? ETIMEDOUT : EIO;
    return snapfg_set_error (err, "s3://%s/%s: %s failed: no reply from the "
                             "S3 endpoint %s after %d attempts: %s",
                             s->bucket, rq->key ? rq->key : "",
                             rq->method, s->endpoint, *attempts,
                             resp->curl_error);
  }
  return 0;
}

/* Turn an HTTP error reply into an errno and a message that names the
 * bucket, the key, the status and S3's error code.
 */
static int
http_failure (struct s3_store *s, const struct s3_request *rq,
              const char *what, const struct s3_response *resp)
{
  CLEANUP_FREE char *code = NULL;
  CLEANUP_FREE char *message = NULL;
  const char *hint = "";
  int err;

  if (!s3_xml_error (resp->body.ptr, resp->body.len, &code, &message)) {
    code = message = NULL;
  }
  if (code == NULL) {
    /* HEAD replies carry no body: name the usual cause by status. */
    code = strdup (resp->status == 404 ? "NotFound"
                   : resp->status == 403 ? "Forbidden"
                   : resp->status == 412 ? "PreconditionFailed"
                   : "no S3 error code");
  }

  switch (resp->status) {
  case 400: err = EINVAL; break;
  case 401: case 403: err = EACCES; break;
  case 404: err = ENOENT; break;
  case 409: case 412: err = EEXIST; break;
  case 507: err = ENOSPC; break;
  default: err = EIO;
  }
  if (code && strcmp (code, "NoSuchBucket") == 0) {
    err = ENXIO;
    hint = ": create the bucket first (for example 'aws s3 mb' or "
      "'s3cmd mb'), or correct the URL";
  }
  else if (code && (strcmp (code, "InvalidAccessKeyId") == 0
                    || strcmp (code, "SignatureDoesNotMatch") == 0
                    || strcmp (code, "AccessDenied") == 0
                    || strcmp (code, "Forbidden") == 0))
    hint = ": check the access key, the secret and the region (from "
      "--s3-credentials, AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or "
      "the AWS credentials file)";
  else if (code && strcmp (code, "QuotaExceeded") == 0)
    err = ENOSPC;

  return snapfg_set_error (err, "s3://%s/%s: %s failed: HTTP %ld %s%s%s "
                           "(endpoint %s)%s",
                           s->bucket, rq->key ? rq->key : "", what,
                           resp->status, code ? code : "",
                           message && *message ? ": " : "",
                           message ? message : "", s->endpoint, hint);
}

static void
response_free (struct s3_response *resp)
{
  s3_bytes_reset (&resp->body);
}

/* --- keys ------------------------------------------------------------ */

/* A key of the interface: components of [A-Za-z0-9._-] separated by
 * single '/'; no "." or ".." component.  Such keys need no escaping in a
 * URL or a copy source, and mean the same on every back end.
 */
static bool
key_is_valid (const char *key, bool allow_empty)
{
  const char *p, *start = key;

  if (*key == '\0')
    return allow_empty;
  for (p = key;; p++) {
    if (*p == '/' || *p == '\0') {
      size_t n = p - start;
      if (n == 0 || (n == 1 && start[0] == '.')
          || (n == 2 && start[0] == '.' && start[1] == '.'))
        return false;
      if (*p == '\0')
        return true;
      start = p + 1;
    }
    else if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z')
               || (*p >= '0' && *p <= '9')
               || *p == '.' || *p == '_' || *p == '-'))
      return false;
  }
}

static int
full_key (struct s3_store *s, const char *key, bool allow_empty, char **out)
{
  if (!key_is_valid (key, allow_empty))
    return snapfg_set_error (EINVAL, "%s: invalid object key \"%s\" (keys are "
                             "[A-Za-z0-9._-] components separated by '/')",
                             s->base.location, key);
  if (asprintf (out, "%s%s", s->prefix, key) < 0) {
    *out = NULL;
    return snapfg_set_error (ENOMEM, "%s: out of memory", s->base.location);
  }
  return 0;
}

/* --- the operations -------------------------------------------------- */

static int s3_get (struct repo_store *rs, const char *key,
                   void **buf, size_t *len);

static int
s3_put (struct repo_store *rs, const char *key,
        const void *buf, size_t len, bool if_absent)
{
  struct s3_store *s = (struct s3_store *) rs;
  CLEANUP_FREE char *k = NULL;
  struct s3_response resp = { 0 };
  struct s3_request rq = {
    .method = "PUT", .body = buf, .body_len = len,
    .if_none_match = if_absent ? "*" : NULL,
  };
  int r, attempts;

  r = full_key (s, key, false, &k);
  if (r < 0)
    return r;
  rq.key = k;
  r = perform (s, &rq, &resp, &attempts);
  if (r < 0)
    goto out;
  if (resp.status == 200)
    r = 0;
  else if (if_absent && resp.status == 412) {
    /* Ours, if an earlier attempt of this call stored it and its reply
     * was lost: then the object holds exactly these bytes.
     */
    r = snapfg_set_error (EEXIST, "s3://%s/%s: exists already",
                          s->bucket, k);
    if (attempts > 1) {
      void *old = NULL;
      size_t old_len;

      if (s3_get (rs, key, &old, &old_len) == 0 && old_len == len
          && memcmp (old, buf, len) == 0)
        r = 0;
      else
        r = snapfg_set_error (EEXIST, "s3://%s/%s: exists already",
                              s->bucket, k);
      free (old);
    }
  }
  else
    r = http_failure (s, &rq, "PUT", &resp);
 out:
  response_free (&resp);
  return r;
}

static int
s3_get (struct repo_store *rs, const char *key, void **buf, size_t *len)
{
  struct s3_store *s = (struct s3_store *) rs;
  CLEANUP_FREE char *k = NULL;
  struct s3_response resp = { 0 };
  struct s3_request rq = { .method = "GET" };
  int r, attempts;

  r = full_key (s, key, false, &k);
  if (r < 0)
    return r;
  rq.key = k;
  r = perform (s, &rq, &resp, &attempts);
  if (r < 0)
    goto out;
  if (resp.status == 200) {
    /* A connection cut short is a curl error already; a length header
     * that disagrees with the body is a broken gateway.
     */
    if (resp.have_length && resp.content_length != resp.body.len) {
      r = snapfg_set_error (EIO, "s3://%s/%s: GET returned %zu bytes, "
                            "Content-Length said %" PRIu64,
                            s->bucket, k, resp.body.len, resp.content_length);
      goto out;
    }
    if (resp.body.len == 0) {
      /* malloc (0) may return NULL: give the caller a real buffer. */
      *buf = malloc (1);
      if (*buf == NULL) {
        r = snapfg_set_error (ENOMEM, "s3://%s/%s: out of memory",
                              s->bucket, k);
        goto out;
      }
    }
    else
      *buf = TAKE_PTR (resp.body.ptr);
    *len = resp.body.len;
    resp.body.len = resp.body.cap = 0;
    r = 0;
  }
  else
    r = http_failure (s, &rq, "GET", &resp);
 out:
  response_free (&resp);
  return r;
}

static int
s3_head (struct repo_store *rs, const char *key, struct repo_object_info *info)
{
  struct s3_store *s = (struct s3_store *) rs;
  CLEANUP_FREE char *k = NULL;
  struct s3_response resp = { 0 };
  struct s3_request rq = { .method = "HEAD" };
  int r, attempts;

  r = full_key (s, key, false, &k);
  if (r < 0)
    return r;
  rq.key = k;
  r = perform (s, &rq, &resp, &attempts);
  if (r < 0)
    goto out;
  if (resp.status == 200) {
    if (!resp.have_length || resp.last_modified < 0) {
      r = snapfg_set_error (EPROTO, "s3://%s/%s: HEAD reply without %s",
                            s->bucket, k, resp.have_length
                            ? "a Last-Modified date" : "a Content-Length");
      goto out;
    }
    info->key = key;
    info->size = resp.content_length;
    info->mtime = resp.last_modified;
  }
  else
    r = http_failure (s, &rq, "HEAD", &resp);
 out:
  response_free (&resp);
  return r;
}

static int
s3_touch (struct repo_store *rs, const char *key)
{
  struct s3_store *s = (struct s3_store *) rs;
  CLEANUP_FREE char *k = NULL;
  CLEANUP_FREE char *source = NULL;
  CLEANUP_FREE char *code = NULL;
  CLEANUP_FREE char *message = NULL;
  struct s3_response resp = { 0 };
  struct s3_request rq = { .method = "PUT" };
  int r, attempts;

  r = full_key (s, key, false, &k);
  if (r < 0)
    return r;
  if (asprintf (&source, "/%s/%s", s->bucket, k) < 0) {
    source = NULL;
    return snapfg_set_error (ENOMEM, "%s: out of memory", s->base.location);
  }
  rq.key = k;
  rq.copy_source = source;
  r = perform (s, &rq, &resp, &attempts);
  if (r < 0)
    goto out;
  /* A copy may fail after its 200 has been sent: the error is then in
   * the body.
   */
  if (resp.status == 200
      && !s3_xml_error (resp.body.ptr, resp.body.len, &code, &message))
    r = 0;
  else {
    if (resp.status == 200)
      resp.status = 500;
    r = http_failure (s, &rq, "touch (copy onto itself)", &resp);
  }
 out:
  response_free (&resp);
  return r;
}

static int
s3_del (struct repo_store *rs, const char *key)
{
  struct s3_store *s = (struct s3_store *) rs;
  CLEANUP_FREE char *k = NULL;
  struct repo_object_info info;
  struct s3_response resp = { 0 };
  struct s3_request rq = { .method = "DELETE" };
  int r, attempts;

  r = s3_head (rs, key, &info);
  if (r < 0)
    return r;
  r = full_key (s, key, false, &k);
  if (r < 0)
    return r;
  rq.key = k;
  r = perform (s, &rq, &resp, &attempts);
  if (r < 0)
    goto out;
  if (resp.status == 204 || resp.status == 200)
    r = 0;
  else
    r = http_failure (s, &rq, "DELETE", &resp);
 out:
  response_free (&resp);
  return r;
}

struct list_state {
  struct s3_store *s;
  repo_list_fn fn;
  void *opaque;
};

static int
list_one (void *opaque, const char *key, uint64_t size, int64_t mtime)
{
  struct list_state *ls = opaque;
  size_t plen = strlen (ls->s->prefix);
  struct repo_object_info info;

  /* Only what is ours: under the prefix, with a key we could have
   * written (another tool's objects in the bucket are not our business).
   */
  if (strncmp (key, ls->s->prefix, plen) != 0
      || !key_is_valid (key + plen, false))
    return 0;
  info.key = key + plen;
  info.size = size;
  info.mtime = mtime;
  return ls->fn (ls->opaque, &info);
}

static char *
escape (const char *s)
{
  /* curl_easy_escape encodes all but A-Za-z0-9-._~ with upper-case hex,
   * which is exactly SigV4's canonical query encoding: the query we send
   * is then already canonical, whatever curl does when it signs it.
   */
  char *e = curl_easy_escape (NULL, s, 0);
  char *copy;

  if (e == NULL)
    return NULL;
  copy = strdup (e);
  curl_free (e);
  return copy;
}

static int
s3_list (struct repo_store *rs, const char *prefix,
         repo_list_fn fn, void *opaque)
{
  struct s3_store *s = (struct s3_store *) rs;
  CLEANUP_FREE char *full_prefix = NULL;
  CLEANUP_FREE char *eprefix = NULL;
  char *token = NULL;
  struct list_state ls = { .s = s, .fn = fn, .opaque = opaque };
  int r = 0;

  /* A listing prefix may end in '/' ("chunks/") or be part of a
   * component ("index/disk1/00"): check it as a key without that end.
   */
  if (*prefix) {
    CLEANUP_FREE char *check = strdup (prefix);
    size_t n;

    if (check == NULL)
      return snapfg_set_error (ENOMEM, "%s: out of memory", s->base.location);
    n = strlen (check);
    if (check[n - 1] == '/')
      check[n - 1] = '\0';
    if (!key_is_valid (check, true))
      return snapfg_set_error (EINVAL, "%s: invalid listing prefix \"%s\"",
                               s->base.location, prefix);
  }
  if (asprintf (&full_prefix, "%s%s", s->prefix, prefix) < 0) {
    full_prefix = NULL;
    return snapfg_set_error (ENOMEM, "%s: out of memory", s->base.location);
  }
  eprefix = escape (full_prefix);
  if (eprefix == NULL)
    return snapfg_set_error (ENOMEM, "%s: out of memory", s->base.location);

  do {
    CLEANUP_FREE char *query = NULL;
    CLEANUP_FREE char *etoken = NULL;
    struct s3_response resp = { 0 };
    struct s3_request rq = { .method = "GET" };
    bool truncated;
    int attempts;

    if (token) {
      etoken = escape (token);
      if (etoken == NULL) {
        r = snapfg_set_error (ENOMEM, "%s: out of memory", s->base.location);
        break;
      }
    }
    /* Parameters in canonical (sorted) order. */
    if (asprintf (&query, "%s%s%slist-type=2&prefix=%s",
                  etoken ? "continuation-token=" : "",
                  etoken ? etoken : "", etoken ? "&" : "", eprefix) < 0) {
      query = NULL;
      r = snapfg_set_error (ENOMEM, "%s: out of memory", s->base.location);
      break;
    }
    rq.query = query;
    r = perform (s, &rq, &resp, &attempts);
    if (r == 0 && resp.status != 200)
      r = http_failure (s, &rq, "list (ListObjectsV2)", &resp);
    free (token);
    token = NULL;
    if (r == 0)
      r = s3_xml_list_page (resp.body.ptr, resp.body.len, list_one, &ls,
                            &truncated, &token);
    response_free (&resp);
    if (r != 0)
      break;
    if (!truncated) {
      free (token);
      token = NULL;
    }
  } while (token);
  free (token);
  return r;
}

static void
s3_close (struct repo_store *rs)
{
  struct s3_store *s = (struct s3_store *) rs;
  size_t i;

  if (s == NULL)
    return;
  for (i = 0; i < s->n_idle; i++)
    curl_easy_cleanup (s->idle[i]);
  free (s->idle);
  pthread_mutex_destroy (&s->lock);
  repo_s3_credentials_clear (&s->cred);
  free (s->endpoint);
  free (s->bucket);
  free (s->prefix);
  free (s->sigv4);
  free (s->base.location);
  free (s);
}

static const struct repo_store_ops s3_ops = {
  .name = "s3",
  .put = s3_put,
  .get = s3_get,
  .head = s3_head,
  .touch = s3_touch,
  .del = s3_del,
  .list = s3_list,
  .close = s3_close,
};

/* --- open ------------------------------------------------------------ */

/* S3's bucket naming rules (3-63 of a-z 0-9 . -, starting and ending
 * with a letter or digit); checked here so that a typo is named as one
 * rather than as a signature or routing error.
 */
static bool
bucket_is_valid (const char *b)
{
  size_t n = strlen (b), i;

  if (n < 3 || n > 63)
    return false;
  for (i = 0; i < n; i++)
    if (!((b[i] >= 'a' && b[i] <= 'z') || (b[i] >= '0' && b[i] <= '9')
          || b[i] == '.' || b[i] == '-'))
      return false;
  return b[0] != '.' && b[0] != '-' && b[n - 1] != '.' && b[n - 1] != '-';
}

/* Split s3://BUCKET[/PREFIX] into s->bucket and s->prefix ("" or
 * "PREFIX/").
 */
static int
parse_url (struct s3_store *s, const char *url)
{
  const char *p, *slash;
  size_t plen;

  if (strncmp (url, "s3://", 5) != 0)
    return snapfg_set_error (EINVAL, "%s: not an S3 URL (s3://BUCKET[/PREFIX])",
                             url);
  p = url + 5;
  slash = strchr (p, '/');
  s->bucket = slash ? strndup (p, slash - p) : strdup (p);
  if (s->bucket == NULL)
    return snapfg_set_error (ENOMEM, "%s: out of memory", url);
  if (!bucket_is_valid (s->bucket))
    return snapfg_set_error (EINVAL, "%s: \"%s\" is not a valid S3 bucket name "
                             "(3-63 characters of a-z, 0-9, '.', '-')",
                             url, s->bucket);
  p = slash ? slash + 1 : "";
  plen = strlen (p);
  while (plen > 0 && p[plen - 1] == '/')
    plen--;
  s->prefix = malloc (plen + 2);
  if (s->prefix == NULL)
    return snapfg_set_error (ENOMEM, "%s: out of memory", url);
  memcpy (s->prefix, p, plen);
  s->prefix[plen] = '\0';
  if (plen > 0 && !key_is_valid (s->prefix, false))
    return snapfg_set_error (EINVAL, "%s: invalid prefix \"%s\" (components of "
                             "[A-Za-z0-9._-] separated by '/')",
                             url, s->prefix);
  if (plen > 0)
    strcpy (s->prefix + plen, "/");
  return 0;
}

static int
set_endpoint (struct s3_store *s, const struct repo_s3_options *o,
              const char *region)
{
  const char *e = o ? o->endpoint : NULL;
  size_t n;

  if (e == NULL || *e == '\0') {
    /* AWS itself; path-style requests work there too. */
    if (asprintf (&s->endpoint, "https://s3.%s.amazonaws.com", region) < 0) {
      s->endpoint = NULL;
      return snapfg_set_error (ENOMEM, "out of memory");
    }
    return 0;
  }
  if (strncmp (e, "http://", 7) != 0 && strncmp (e, "https://", 8) != 0)
    return snapfg_set_error (EINVAL, "S3 endpoint \"%s\": expected "
                             "http://HOST[:PORT] or https://HOST[:PORT]", e);
  if (strchr (e, '?') || strchr (e, '#') || strchr (e, '@'))
    return snapfg_set_error (EINVAL, "S3 endpoint \"%s\": give only the "
                             "scheme, host and port (credentials never go "
                             "in the URL)", e);
  s->endpoint = strdup (e);
  if (s->endpoint == NULL)
    return snapfg_set_error (ENOMEM, "out of memory");
  n = strlen (s->endpoint);
  while (n > 0 && s->endpoint[n - 1] == '/')
    s->endpoint[--n] = '\0';
  s->fresh_connections = strncmp (s->endpoint, "http://", 7) == 0;
  return 0;
}

/* One small listing proves the endpoint answers, the keys are right and
 * the bucket exists, so that these are reported at open with their
 * cause, not as the first chunk that fails.
 */
static int
probe (struct s3_store *s)
{
  CLEANUP_FREE char *eprefix = escape (s->prefix);
  CLEANUP_FREE char *query = NULL;
  struct s3_response resp = { 0 };
  struct s3_request rq = { .method = "GET" };
  int r, attempts;

  if (eprefix == NULL
      || asprintf (&query, "list-type=2&max-keys=1&prefix=%s", eprefix) < 0) {
    query = NULL;
    return snapfg_set_error (ENOMEM, "out of memory");
  }
  rq.query = query;
  r = perform (s, &rq, &resp, &attempts);
  if (r == 0 && resp.status != 200)
    r = http_failure (s, &rq, "opening the repository (ListObjectsV2)", &resp);
  response_free (&resp);
  return r;
}

int
repo_store_s3_open (const char *url, const struct repo_s3_options *o,
                    struct repo_store **out)
{
  struct s3_store *s;
  const char *region = o && o->region && *o->region ? o->region : "us-east-1";
  int r;

  *out = NULL;
  pthread_once (&curl_once, curl_init_once);
  if (curl_load_error[0])
    return snapfg_set_error (EIO, "%s: %s", url, curl_load_error);
  if (curl_init_result != CURLE_OK)
    return snapfg_set_error (EIO, "%s: libcurl failed to initialise: %s",
                             url, curl_easy_strerror (curl_init_result));
  s3_xml_init ();

  s = calloc (1, sizeof *s);
  if (s == NULL)
    return snapfg_set_error (ENOMEM, "%s: out of memory", url);
  pthread_mutex_init (&s->lock, NULL);
  s->base.ops = &s3_ops;
  s->base.location = strdup (url);
  if (s->base.location == NULL) {
    r = snapfg_set_error (ENOMEM, "%s: out of memory", url);
    goto fail;
  }
  r = parse_url (s, url);
  if (r < 0)
    goto fail;
  r = set_endpoint (s, o, region);
  if (r < 0)
    goto fail;
  if (asprintf (&s->sigv4, "aws:amz:%s:s3", region) < 0) {
    s->sigv4 = NULL;
    r = snapfg_set_error (ENOMEM, "%s: out of memory", url);
    goto fail;
  }
  r = repo_s3_credentials_load (o, &s->cred);
  if (r < 0)
    goto fail;
  r = probe (s);
  if (r < 0)
    goto fail;
  *out = &s->base;
  return 0;

 fail:
  s3_close (&s->base);
  return r;
}
