/* snapfg: the store types, listed once.
 *
 * X (NAME, OPEN, SUMMARY): NAME is the store= value (a bare word), OPEN
 * the type's open function (store.h declares it), SUMMARY one line for
 * usage texts.  The first is the default.  Everything that names the
 * choices comes from this list: store_open and store_type_find
 * (store.c), the plugin's store= check and help, the engine's default,
 * the messages listing the types, snapfgctl's usage.
 *
 * Adding a store type: a file of its own (store-NAME.c) whose open
 * function fills in a struct snapfg_store_ops (store.h), one line here,
 * and the file in Makefile.am.
 */
#ifndef SNAPFG_STORE_TYPES_H
#define SNAPFG_STORE_TYPES_H

#define SNAPFG_STORE_TYPES(X)                                            \
  X (persistent, persistent_store_open,                                  \
     "dm-snapshot's on-disk format: survives restarts and crashes")      \
  X (transient, transient_store_open,                                    \
     "exception table in memory only (dm's N): every start is new")

/* The names as one string literal, " persistent transient", for texts
 * that must be constant (nbdkit's help) and for messages.
 */
#define SNAPFG_STORE_TYPE_WORD_(name, open, summary) " " #name
#define SNAPFG_STORE_TYPE_WORDS SNAPFG_STORE_TYPES (SNAPFG_STORE_TYPE_WORD_)

#endif
