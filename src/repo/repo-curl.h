/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg repository: libcurl, loaded when an S3 store is first opened.
 *
 * Linked in, libcurl-gnutls and what it pulls in (Kerberos, LDAP,
 * OpenSSL's libcrypto, SSH, RTMP, brotli, nghttp2: 18 libraries more
 * than the tools need otherwise) cost every start of snapfg-backup 7-12
 * ms of CPU in the dynamic loader and about 10 ms of wall time (perf
 * stat -r 50 of snapfg-backup --version: 18-23 ms of CPU linked, 10.6-
 * 10.7 loaded), and a directory repository never calls it.
 * Loaded with dlopen by repo_curl_load, the S3 back end calls it through
 * the table below; repo-store-s3.c includes this header after
 * <curl/curl.h> with REPO_CURL_CALLS defined, so that its curl_* calls
 * are the table's.
 */

#ifndef SNAPFG_REPO_CURL_H
#define SNAPFG_REPO_CURL_H

#include <stddef.h>

#include <curl/curl.h>

struct repo_curl {
  CURLcode (*global_init) (long flags);
  CURL *(*easy_init) (void);
  void (*easy_cleanup) (CURL *h);
  void (*easy_reset) (CURL *h);
  CURLcode (*easy_setopt) (CURL *h, CURLoption option, ...);
  CURLcode (*easy_perform) (CURL *h);
  CURLcode (*easy_getinfo) (CURL *h, CURLINFO info, ...);
  const char *(*easy_strerror) (CURLcode code);
  char *(*easy_escape) (CURL *h, const char *s, int len);
  void (*free) (void *p);
  struct curl_slist *(*slist_append) (struct curl_slist *l, const char *s);
  void (*slist_free_all) (struct curl_slist *l);
};

extern struct repo_curl repo_curl;

/* Load libcurl and fill repo_curl (once; thread-safe).  0, or -1 with
 * why in err (the library or one of its functions not found).
 */
extern int repo_curl_load (char *err, size_t err_len);

#ifdef REPO_CURL_CALLS
/* curl.h's own three-argument macros for these two give way. */
#undef curl_easy_setopt
#undef curl_easy_getinfo
#define curl_global_init repo_curl.global_init
#define curl_easy_init repo_curl.easy_init
#define curl_easy_cleanup repo_curl.easy_cleanup
#define curl_easy_reset repo_curl.easy_reset
#define curl_easy_setopt repo_curl.easy_setopt
#define curl_easy_perform repo_curl.easy_perform
#define curl_easy_getinfo repo_curl.easy_getinfo
#define curl_easy_strerror repo_curl.easy_strerror
#define curl_easy_escape repo_curl.easy_escape
#define curl_free repo_curl.free
#define curl_slist_append repo_curl.slist_append
#define curl_slist_free_all repo_curl.slist_free_all
#endif

#endif /* SNAPFG_REPO_CURL_H */
