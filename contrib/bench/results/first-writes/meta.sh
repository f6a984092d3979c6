# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
RUNTIME=3
ROUNDS=3
NUMJOBS=1\ 2\ 4\ 8
NUMJOBS_PEERS=1\ 2\ 4\ 8
IODEPTH=16
SEQ_IODEPTH=8
PHASES=firstwrite\ seqfirst\ overwrite
SIZE=1G
CHUNK_SIZE=4K
run_systems=\ bare\ snapfg-nosnap\ snapfg-transient\ snapfg-persistent\ snapfg-persistent-flush
skipped=''
STARTUP_EXCEPTIONS=1000000
load_at_start=8.80\ 14.33\ 16.13
t_start=1796163646
t_fio=1796164939
t_end=1796164939
