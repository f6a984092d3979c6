# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
RUNTIME=5
ROUNDS=3
NUMJOBS=1\ 2\ 4\ 8
NUMJOBS_PEERS=1\ 2\ 4\ 8
IODEPTH=16
SIZE=1G
CHUNK_SIZE=4K
run_systems=\ bare\ snapfg-nosnap\ snapfg-transient\ snapfg-persistent\ snapfg-global
skipped=''
STARTUP_EXCEPTIONS=1000000
load_at_start=2.67\ 2.96\ 3.05
t_start=1796033658
t_fio=1796035805
t_end=1796035822
