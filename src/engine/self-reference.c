/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: is an NBD URI given as a COW store this server itself?
 *
 * A COW store served by this very nbdkit would deadlock the first origin
 * write (the copy-out waits for a request that waits for the copy-out),
 * and a persistent store would write its header over the origin.  Files
 * are compared by inode when the store opens (store.c); an NBD URI must
 * be recognised before anything connects to it, from what the URI names:
 *
 *   nbd+unix:///EXPORT?socket=PATH   PATH is one of our listening Unix
 *                                    sockets (nbdkit -U), by name or inode;
 *   nbd://HOST[:PORT]/EXPORT         PORT is one we listen on and HOST
 *                                    is an address of this machine.
 *
 * Our sockets are found in /proc: the socket inodes among our descriptors
 * matched against /proc/net/unix and /proc/net/tcp{,6} (once nbdkit has
 * bound them), and nbdkit's own -U/--unix and -p/--port options from
 * /proc/self/cmdline (at start-up, before it binds them).
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <dirent.h>
#include <unistd.h>
#include <netdb.h>
#include <ifaddrs.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include "self-reference.h"
#include "vector.h"

/* The inodes of our open sockets. */
DEFINE_VECTOR_TYPE (inode_set, unsigned long);

static void
our_socket_inodes (inode_set *set)
{
  DIR *d = opendir ("/proc/self/fd");
  struct dirent *de;

  *set = (inode_set) { 0 };
  if (d == NULL)
    return;
  while ((de = readdir (d)) != NULL) {
    char link[PATH_MAX], target[64];
    ssize_t len;
    unsigned long ino;

    snprintf (link, sizeof link, "/proc/self/fd/%s", de->d_name);
    len = readlink (link, target, sizeof target - 1);
    if (len <= 0)
      continue;
    target[len] = '\0';
    if (sscanf (target, "socket:[%lu]", &ino) == 1 &&
        inode_set_append (set, ino) < 0)
      break;
  }
  closedir (d);
}

static bool
in_set (const inode_set *set, unsigned long ino)
{
  for (size_t i = 0; i < set->len; ++i)
    if (set->ptr[i] == ino)
      return true;
  return false;
}

/* nbdkit's command line, NUL-separated. */
static char *
read_cmdline (size_t *len)
{
  FILE *fp = fopen ("/proc/self/cmdline", "re");
  char_vector buf = { 0 };
  size_t got;

  if (fp == NULL)
    return NULL;
  do {
    if (char_vector_reserve (&buf, 4096) < 0)
      break;
    got = fread (buf.ptr + buf.len, 1, buf.cap - buf.len, fp);
    buf.len += got;
  } while (got > 0);
  fclose (fp);
  *len = buf.len;
  return buf.ptr;
}

/* The value of nbdkit option short/long (e.g. "-U", "--unix") on its
 * command line, copied into out; false if not given.  Stops at the
 * plugin name (the first argument that is not an option or its value is
 * hard to know in general, but our options all come before "snapfg").
 */
static bool
nbdkit_option (const char *shortopt, const char *longopt, char *out,
               size_t outlen)
{
  size_t len, longlen = strlen (longopt);
  char *buf = read_cmdline (&len), *p, *end;
  bool found = false;

  if (buf == NULL)
    return false;
  end = buf + len;
  for (p = buf; p < end; p += strlen (p) + 1) {
    const char *value = NULL;

    if (strcmp (p, shortopt) == 0 || strcmp (p, longopt) == 0) {
      if (p + strlen (p) + 1 < end)
        value = p + strlen (p) + 1;
    }
    else if (strncmp (p, longopt, longlen) == 0 && p[longlen] == '=')
      value = p + longlen + 1;
    else if (strncmp (p, shortopt, 2) == 0 && p[2] != '\0' && p[1] != '-')
      value = p + 2;            /* -Upath */
    if (value) {
      snprintf (out, outlen, "%s", value);
      found = true;
    }
  }
  free (buf);
  return found;
}

/* Do two socket paths name the same socket? */
static bool
same_socket_path (const char *a, const char *b)
{
  struct stat sa, sb;
  char ra[PATH_MAX], rb[PATH_MAX];

  if (strcmp (a, b) == 0)
    return true;
  if (stat (a, &sa) == 0 && stat (b, &sb) == 0 &&
      sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino)
    return true;
  return realpath (a, ra) && realpath (b, rb) && strcmp (ra, rb) == 0;
}

static bool
is_own_unix_socket (const char *path, char *ours, size_t ourslen)
{
  inode_set set;
  FILE *fp;
  char line[PATH_MAX + 256];
  bool found = false;

  if (nbdkit_option ("-U", "--unix", ours, ourslen) &&
      strcmp (ours, "-") != 0 && same_socket_path (path, ours))
    return true;

  our_socket_inodes (&set);
  fp = fopen ("/proc/net/unix", "re");
  if (fp) {
    while (!found && fgets (line, sizeof line, fp)) {
      unsigned long ino;
      char sockpath[PATH_MAX];
      int fields;

      /* Num RefCount Protocol Flags Type St Inode Path */
      fields = sscanf (line, "%*s %*s %*s %*s %*s %*s %lu %4095s",
                       &ino, sockpath);
      if (fields == 2 && sockpath[0] != '@' && in_set (&set, ino) &&
          same_socket_path (path, sockpath)) {
        snprintf (ours, ourslen, "%s", sockpath);
        found = true;
      }
    }
    fclose (fp);
  }
  inode_set_reset (&set);
  return found;
}

/* The TCP ports we listen on, from /proc/net/tcp and tcp6. */
static bool
listens_on_port (unsigned port)
{
  static const char *const files[] = { "/proc/net/tcp", "/proc/net/tcp6" };
  inode_set set;
  bool found = false;
  char opt[64];

  if (nbdkit_option ("-p", "--port", opt, sizeof opt) &&
      (unsigned) strtoul (opt, NULL, 10) == port)
    return true;

  our_socket_inodes (&set);
  for (size_t f = 0; !found && f < 2; ++f) {
    FILE *fp = fopen (files[f], "re");
    char line[512];

    if (fp == NULL)
      continue;
    while (!found && fgets (line, sizeof line, fp)) {
      char local[128];
      unsigned st;
      unsigned long ino;
      char *colon;

      /* sl local_address rem_address st tx:rx tr:when retrnsmt uid
       * timeout inode
       */
      if (sscanf (line, "%*s %127s %*s %x %*s %*s %*s %*s %*s %lu",
                  local, &st, &ino) != 3)
        continue;
      colon = strrchr (local, ':');
      if (st == 0x0a /* LISTEN */ && colon && in_set (&set, ino) &&
          strtoul (colon + 1, NULL, 16) == port)
        found = true;
    }
    fclose (fp);
  }
  inode_set_reset (&set);
  return found;
}

static bool
same_address (const struct sockaddr *a, const struct sockaddr *b)
{
  if (a->sa_family != b->sa_family)
    return false;
  if (a->sa_family == AF_INET)
    return ((const struct sockaddr_in *) a)->sin_addr.s_addr ==
      ((const struct sockaddr_in *) b)->sin_addr.s_addr;
  if (a->sa_family == AF_INET6)
    return memcmp (&((const struct sockaddr_in6 *) a)->sin6_addr,
                   &((const struct sockaddr_in6 *) b)->sin6_addr,
                   sizeof (struct in6_addr)) == 0;
  return false;
}

/* Is host one of this machine's addresses? */
static bool
is_local_host (const char *host)
{
  struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *res, *ai;
  struct ifaddrs *ifs = NULL, *ifa;
  bool local = false;

  if (host[0] == '\0')
    return true;                /* libnbd's default: localhost */
  if (getaddrinfo (host, NULL, &hints, &res) != 0)
    return false;
  getifaddrs (&ifs);
  for (ai = res; ai && !local; ai = ai->ai_next) {
    if (ai->ai_family == AF_INET) {
      const struct sockaddr_in *sin = (const void *) ai->ai_addr;
      uint32_t addr = ntohl (sin->sin_addr.s_addr);
      if ((addr >> 24) == 127 || addr == 0)
        local = true;
    }
    else if (ai->ai_family == AF_INET6) {
      const struct sockaddr_in6 *sin6 = (const void *) ai->ai_addr;
      if (IN6_IS_ADDR_LOOPBACK (&sin6->sin6_addr) ||
          IN6_IS_ADDR_UNSPECIFIED (&sin6->sin6_addr))
        local = true;
    }
    for (ifa = ifs; ifa && !local; ifa = ifa->ifa_next)
      if (ifa->ifa_addr && same_address (ifa->ifa_addr, ai->ai_addr))
        local = true;
  }
  if (ifs)
    freeifaddrs (ifs);
  freeaddrinfo (res);
  return local;
}

/* Percent-decode src[0..len) into out. */
static void
uri_decode (const char *src, size_t len, char *out, size_t outlen)
{
  size_t o = 0;

  for (size_t i = 0; i < len && o + 1 < outlen; ++i) {
    if (src[i] == '%' && i + 2 < len + 0 && src[i + 1] && src[i + 2]) {
      char hex[3] = { src[i + 1], src[i + 2], '\0' };
      out[o++] = (char) strtoul (hex, NULL, 16);
      i += 2;
    }
    else
      out[o++] = src[i];
  }
  out[o] = '\0';
}

bool
self_reference_uri (const char *uri, char *why, size_t why_len)
{
  const char *sep = strstr (uri, "://");
  const char *authority, *query;
  char scheme[32];
  size_t slen;

  if (sep == NULL)
    return false;
  slen = sep - uri;
  if (slen >= sizeof scheme)
    return false;
  memcpy (scheme, uri, slen);
  scheme[slen] = '\0';
  authority = sep + 3;
  query = strchr (authority, '?');

  if (strstr (scheme, "+unix")) {
    char path[PATH_MAX], ours[PATH_MAX];
    const char *p = query;

    while (p) {
      p++;
      if (strncmp (p, "socket=", 7) == 0) {
        const char *end = strchr (p, '&');
        p += 7;
        uri_decode (p, end ? (size_t) (end - p) : strlen (p),
                    path, sizeof path);
        if (is_own_unix_socket (path, ours, sizeof ours)) {
          snprintf (why, why_len, "names this server's own socket %s",
                    ours);
          return true;
        }
        return false;
      }
      p = strchr (p, '&');
    }
    return false;
  }
  if (strstr (scheme, "+vsock"))
    return false;               /* cannot tell; nbdkit --vsock is rare */

  /* TCP: nbd[s]://HOST[:PORT][/EXPORT][?...] */
  {
    char host[256] = "", portstr[16] = "";
    const char *end = authority + strcspn (authority, "/?#");
    const char *at = memchr (authority, '@', end - authority);
    const char *h = at ? at + 1 : authority, *colon;
    unsigned port = 10809;

    if (*h == '[') {
      const char *close = memchr (h, ']', end - h);
      if (close == NULL)
        return false;
      snprintf (host, sizeof host, "%.*s", (int) (close - h - 1), h + 1);
      colon = close + 1 < end && close[1] == ':' ? close + 1 : NULL;
    }
    else {
      colon = memchr (h, ':', end - h);
      snprintf (host, sizeof host, "%.*s",
                (int) ((colon ? colon : end) - h), h);
    }
    if (colon) {
      snprintf (portstr, sizeof portstr, "%.*s", (int) (end - colon - 1),
                colon + 1);
      port = strtoul (portstr, NULL, 10);
    }
    if (listens_on_port (port) && is_local_host (host)) {
      snprintf (why, why_len, "names this server's own TCP port %u on "
                "this machine (%s)", port, host[0] ? host : "localhost");
      return true;
    }
  }
  return false;
}
