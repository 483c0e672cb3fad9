// The C++ core's one vocabulary of checks. Every check throws a c10::Error through TORCH_CHECK (never
// abort()): the dispatcher and pybind11 turn it into a Python exception with our message, so a bad call or
// a bad bundle costs the caller an exception, never the process.
//
// Policy:
// * FLYSHIP_CHECK        a call's inputs (or the device) do not allow it; recoverable, RuntimeError in Python.
// * FLYSHIP_CHECK_TYPE   an argument of the wrong Python/torch type; TypeError.
// * FLYSHIP_CHECK_VALUE  an argument value out of range; ValueError.
// * FLYSHIP_PLAN_CHECK   the plan Python lowered is malformed: the loader and this extension disagree, or a
//                        bundle got past the load checks; the message says where in the plan.
// * FLYSHIP_INTERNAL_ASSERT  a bug in flyship itself (an invariant the core established earlier).
// Messages follow `<operation>: expected <X>, got <Y> [where]; <what to do>`.
#pragma once

#include <c10/util/Exception.h>

#define FLYSHIP_CHECK(cond, ...) TORCH_CHECK(cond, __VA_ARGS__)
#define FLYSHIP_CHECK_TYPE(cond, ...) TORCH_CHECK_TYPE(cond, __VA_ARGS__)
#define FLYSHIP_CHECK_VALUE(cond, ...) TORCH_CHECK_VALUE(cond, __VA_ARGS__)
#define FLYSHIP_PLAN_CHECK(cond, where, ...) TORCH_CHECK(cond, "flyship plan: ", where, ": ", __VA_ARGS__)
#define FLYSHIP_INTERNAL_ASSERT(cond, ...) TORCH_INTERNAL_ASSERT(cond, __VA_ARGS__)
