/* libFuzzer target for the control protocol's request parser.
 *
 * Every byte a control client sends reaches control_parse_request (and
 * through it json_parse) first, so it must cope with anything: it either
 * fills in a request, which must then be consistent, or refuses with a
 * message.  Built and run by tests/test-fuzz-control.sh:
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -I$top_srcdir/src \
 *     -I$top_builddir tests/fuzz-control-protocol.c src/control-protocol.c \
 *     src/json.c -lm
 *
 * Besides crashes, leaks and undefined behaviour (the sanitizers), it
 * checks what the parser promises: an error always comes with a
 * non-empty, NUL-terminated message that fits the buffer; a request
 * that parses names a known command with the arguments it requires
 * (non-empty strings, positive sizes); anything longer than
 * CONTROL_MAX_LINE is refused; and freeing leaves the request zeroed.
 */

#include <config.h>

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "control-protocol.h"
#include "json.h"

static void
check (int cond, const char *what)
{
  if (!cond) {
    fprintf (stderr, "fuzz-control-protocol: broken promise: %s\n", what);
    abort ();
  }
}

static void
check_string (const char *s, int required, const char *what)
{
  if (s == NULL) {
    check (!required, what);
    return;
  }
  check (s[0] != '\0', what);
  (void) strlen (s);            /* ASan: a real, terminated string */
}

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
  struct control_request req;
  /* An error buffer with guard bytes after it: the message must fit. */
  char err[256 + 16];
  int r;

  memset (err, 'G', sizeof err);
  memset (&req, 0xa5, sizeof req);
  r = control_parse_request ((const char *) data, size, &req, err, 256);
  for (size_t i = 256; i < sizeof err; ++i)
    check (err[i] == 'G', "the error message overran its buffer");

  if (r < 0) {
    check (r == -1, "control_parse_request returned neither 0 nor -1");
    check (memchr (err, '\0', 256) != NULL, "error message not terminated");
    check (err[0] != '\0', "error without a message");
    /* A refused request must hold nothing to free. */
    check (req.name == NULL && req.cow == NULL && req.store == NULL,
           "a refused request still holds strings");
    return 0;
  }

  check (r == 0, "control_parse_request returned neither 0 nor -1");
  check (size <= CONTROL_MAX_LINE, "a line over CONTROL_MAX_LINE was accepted");
  check (memchr (data, '\0', size) == NULL, "a line with a NUL was accepted");
  switch (req.cmd) {
  case CONTROL_STATUS:
    check_string (req.name, 0, "status: bad name");
    break;
  case CONTROL_LIST:
  case CONTROL_STATS:
    check (req.name == NULL, "list/stats with a name");
    break;
  case CONTROL_CREATE:
    check_string (req.name, 1, "create: no name");
    check_string (req.cow, 0, "create: bad cow");   /* optional with state= */
    check_string (req.store, 0, "create: bad store");
    break;
  case CONTROL_DROP:
  case CONTROL_MERGE:
  case CONTROL_CHANGED:
    check_string (req.name, 1, "drop/merge/changed: no name");
    break;
  case CONTROL_SET_BLOCK_SIZE:
    check (req.block_size > 0, "set-block-size without a positive size");
    break;
  default:
    check (0, "unknown command accepted");
  }
  if (req.cmd != CONTROL_CREATE)
    check (req.cow == NULL && req.store == NULL && req.chunk_size == 0 &&
           req.cow_size == 0, "create-only arguments on another command");
  if (req.cmd != CONTROL_SET_BLOCK_SIZE)
    check (req.block_size == 0, "block_size on another command");
  /* Sizes arrive as positive JSON integers. */
  check (req.chunk_size <= (uint64_t) INT64_MAX &&
         req.cow_size <= (uint64_t) INT64_MAX &&
         req.block_size <= (uint64_t) INT64_MAX, "size out of range");

  control_request_free (&req);
  check (req.name == NULL && req.cow == NULL && req.store == NULL,
         "control_request_free left pointers behind");
  return 0;
}
