/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: the store types, listed once.
 *
 * X (NAME, OPEN, SURVIVES_RESTART, SUMMARY): NAME is the store= value (a
 * bare word), OPEN the type's open function (store.h declares it),
 * SURVIVES_RESTART whether a restart can bring its snapshot back (its
 * exceptions are on disk), SUMMARY one line for usage texts.  The first
 * list holds the default type, the second the others.
 *
 * Everything that names the choices comes from here: store_open and
 * store_type_find (store.c), the plugin's store= check and help, the
 * engine's default, the catalogue's restart (lifecycle.c), the control
 * protocol's create command and snapfgctl's usage (control-commands.def),
 * and the messages listing the types.
 *
 * Adding a store type: a file of its own (store-NAME.c) whose open
 * function fills in a struct snapfg_store_ops (store.h), one line in
 * SNAPFG_OTHER_STORE_TYPES_, the file in Makefile.am, and its
 * description in the man pages.
 */
#ifndef SNAPFG_STORE_TYPES_H
#define SNAPFG_STORE_TYPES_H

#define SNAPFG_DEFAULT_STORE_TYPE_(X)                                    \
  X (persistent, persistent_store_open, true,                            \
     "dm-snapshot's on-disk format: survives restarts and crashes")

#define SNAPFG_OTHER_STORE_TYPES_(X)                                     \
  X (transient, transient_store_open, false,                             \
     "exception table in memory only (dm's N): every start is new")

#define SNAPFG_STORE_TYPES(X)                                            \
  SNAPFG_DEFAULT_STORE_TYPE_ (X) SNAPFG_OTHER_STORE_TYPES_ (X)

/* String literals, for texts that must be constant (nbdkit's help, the
 * control command table) and for messages: the default's name
 * ("persistent") and the choices ("persistent|transient").
 */
#define SNAPFG_STORE_TYPE_NAME_(name, open, survives, summary) #name
#define SNAPFG_STORE_TYPE_BAR_NAME_(name, open, survives, summary) "|" #name
#define SNAPFG_DEFAULT_STORE_TYPE                                        \
  SNAPFG_DEFAULT_STORE_TYPE_ (SNAPFG_STORE_TYPE_NAME_)
#define SNAPFG_STORE_TYPE_CHOICES                                        \
  SNAPFG_DEFAULT_STORE_TYPE_ (SNAPFG_STORE_TYPE_NAME_)                   \
  SNAPFG_OTHER_STORE_TYPES_ (SNAPFG_STORE_TYPE_BAR_NAME_)

#endif
