/* Ember: PyTorch's device model in C. Include this one header. */
#ifndef EMBER_EMBER_H
#define EMBER_EMBER_H

#define EMBER_VERSION_MAJOR 0
#define EMBER_VERSION_MINOR 1
#define EMBER_VERSION_PATCH 0

#include <ember/error.h>
#include <ember/dtype.h>
#include <ember/device.h>
#include <ember/telemetry.h>
#include <ember/tensor.h>
#include <ember/ops.h>
#include <ember/autograd.h>
#include <ember/nn.h>
#include <ember/optim.h>
#include <ember/io.h>
#include <ember/data.h>
#include <ember/kernel.h>
#include <ember/memory.h>
#include <ember/estimate.h>
#include <ember/parse.h>

#endif
