# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
RUNTIME=3
ROUNDS=3
NUMJOBS=1\ 2\ 4\ 8
NUMJOBS_PEERS=1\ 2\ 4\ 8
IODEPTH=16
SEQ_IODEPTH=8
PHASES=firstwrite\ seqfirst
SIZE=1G
CHUNK_SIZE=64K
run_systems=\ bare\ snapfg-transient\ snapfg-persistent\ snapfg-persistent-flush
skipped=''
STARTUP_EXCEPTIONS=1000000
load_at_start=20.65\ 17.12\ 15.32
t_start=1796161826
t_fio=1796162630
t_end=1796162630
