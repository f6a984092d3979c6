/* snapfg: exception stores, the parts every store shares (see store.h). */

#include <config.h>

#include <string.h>
#include <errno.h>

#include "store.h"
#include "snapfg-log.h"

int
store_open (const struct snapfg_store_params *params,
            struct snapfg_store **stp)
{
  if (strcmp (params->type, "transient") == 0)
    return transient_store_open (params, stp);
  if (strcmp (params->type, "persistent") == 0) {
    snapfg_error ("store=persistent: the persistent (dm on-disk format) "
                  "store is not implemented in this version; "
                  "use store=transient");
    return -ENOTSUP;
  }
  snapfg_error ("store=%s: unknown store type "
                "(expected transient or persistent)", params->type);
  return -EINVAL;
}

int
store_bump_alloc (struct snapfg_store *st, uint64_t *new_chunk)
{
  /* An atomic bump pointer: concurrent copy-outs never serialise on a
   * lock to get their chunk.  Overshooting max_chunks is harmless: the
   * pointer only grows, and every later caller sees ENOSPC too.
   */
  uint64_t chunk = atomic_fetch_add (&st->next_chunk, 1);

  if (chunk >= st->max_chunks)
    return -ENOSPC;
  *new_chunk = chunk;
  return 0;
}
