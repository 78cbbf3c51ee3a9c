// The op library: schemas (shape rules, arity) shared by compiler and runtime,
// and the per-backend kernel registries.
#pragma once
#include "sd/ops/kernel.h"
#include "sd/ops/schema.h"
