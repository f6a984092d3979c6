/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg repository: the S3 replies the back end reads (libxml2).
 *
 * Two documents only: a ListObjectsV2 page (ListBucketResult) and an
 * error (Error: Code, Message).  Elements are matched by local name, so
 * that the namespace a gateway declares (or omits) does not matter.
 */
#ifndef SNAPFG_S3_XML_H
#define SNAPFG_S3_XML_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Call once before any other function here (from the first open). */
extern void s3_xml_init (void);

/* The Code and Message of an S3 error document, malloc'd (either may be
 * NULL); false if body is not one.
 */
extern bool s3_xml_error (const char *body, size_t len,
                          char **code, char **message);

/* One object of a listing page: its full key (with the store's prefix). */
typedef int (*s3_xml_object_fn) (void *opaque, const char *key,
                                 uint64_t size, int64_t mtime);

/* Parse one ListObjectsV2 page: fn for each Contents entry, then
 * *truncated and *next_token (malloc'd, NULL if none).  Returns 0, a
 * non-zero value of fn (the walk stops there), or -EPROTO with the
 * thread's error record set if the page is not what S3 sends.
 */
extern int s3_xml_list_page (const char *body, size_t len,
                             s3_xml_object_fn fn, void *opaque,
                             bool *truncated, char **next_token);

/* "2026-12-07T02:11:12.000Z" (ISO 8601, listings) and
 * "Mon, 07 Dec 2026 02:11:12 GMT" (RFC 7231, Last-Modified) as seconds
 * since the epoch; -1 if s is neither.  Locale-independent.
 */
extern int64_t s3_parse_iso8601 (const char *s);
extern int64_t s3_parse_http_date (const char *s);

#endif
