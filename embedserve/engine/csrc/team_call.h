/*
 * What a kernel module needs to run a call on helper_team.h's team without holding one of
 * its own: the item and runner types, and the name of the capsule bf16_linear.c exports
 * its ``team_run`` in (one helper thread per process; int8_linear.c borrows it).
 */
#ifndef EMBEDSERVE_TEAM_CALL_H
#define EMBEDSERVE_TEAM_CALL_H

#include <Python.h>

typedef void (*team_item)(const void *call, Py_ssize_t item);
typedef void (*team_runner)(team_item run_item, const void *call, Py_ssize_t items);

#define TEAM_MODULE "embedserve.engine._bf16_linear"
#define TEAM_CAPSULE TEAM_MODULE ".team_run"

#endif
