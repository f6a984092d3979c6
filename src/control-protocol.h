/* snapfg: the control protocol spoken over the control= socket.
 *
 * One JSON object per line each way.  A request names a command and its
 * arguments; the reply has "ok": true and the command's data, or
 * "ok": false and "error": a message.  See snapfgctl(1).
 *
 *   {"cmd":"status"}                     {"cmd":"status","name":"snap1"}
 *   {"cmd":"list"}
 *   {"cmd":"create","name":"snap1","cow":"/path","store":"persistent",
 *    "chunk_size":4096,"cow_size":1073741824}
 *   {"cmd":"drop","name":"snap1"}
 *   {"cmd":"set-block-size","block_size":4096}
 *   {"cmd":"merge","name":"snap1"}
 *   {"cmd":"changed","name":"snap1"}
 *   {"cmd":"stats"}
 *   {"cmd":"checkpoint-create","name":"c1"}
 *   {"cmd":"checkpoint-list"}
 *   {"cmd":"checkpoint-drop","name":"c1"}
 *   {"cmd":"create","name":"snap2","cow":"/path","checkpoint":"c2"}
 *   {"cmd":"changed","since":"c1"}   {"cmd":"changed","since":"c1","name":"snap2"}
 */
#ifndef SNAPFG_CONTROL_PROTOCOL_H
#define SNAPFG_CONTROL_PROTOCOL_H

#include <stddef.h>
#include <stdint.h>

/* Requests longer than this (without the newline) are refused. */
#define CONTROL_MAX_LINE 4096

enum control_cmd {
  CONTROL_STATUS,
  CONTROL_LIST,
  CONTROL_CREATE,
  CONTROL_DROP,
  CONTROL_SET_BLOCK_SIZE,
  CONTROL_MERGE,
  CONTROL_CHANGED,
  CONTROL_STATS,
  CONTROL_CHECKPOINT_CREATE,
  CONTROL_CHECKPOINT_LIST,
  CONTROL_CHECKPOINT_DROP,
};

struct control_request {
  enum control_cmd cmd;
  char *name;                   /* status (optional), create, drop, ... */
  char *cow;                    /* create */
  char *store;                  /* create (optional) */
  uint64_t chunk_size;          /* create (optional, 0: default) */
  uint64_t cow_size;            /* create (optional, 0: default) */
  uint64_t block_size;          /* set-block-size */
  char *checkpoint;             /* create (optional) */
  char *since;                  /* changed (optional) */
};

/* Parse one request line (without its newline).  Returns 0, or -1 with
 * a message saying what is wrong in err.
 */
extern int control_parse_request (const char *line, size_t len,
                                  struct control_request *req,
                                  char *err, size_t err_len);
extern void control_request_free (struct control_request *req);

#endif
