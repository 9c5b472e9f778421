// Opt existing VMs, scale sets and availability sets of one resource group in to scheduled
// events outside the VM: scheduledEventsPolicy.scheduledEventsAdditionalPublishingTargets
// .eventGridAndResourceGraph, which publishes every state of every event to the Event Grid
// system topic Microsoft.ResourceNotifications.MaintenanceResources and to Azure Resource
// Graph. Preview: needs Compute API 2025-04-01 or later (used here) and the subscription's
// feature registrations SendScheduledEventsPolicy (Microsoft.Compute) and
// ScheduledEventsActivity (Microsoft.Maintenance) (docs/agentless.md).
// A VM in an availability set or a scale set takes its set's policy: list the set, not its VMs.
// The rest of each resource's scheduledEventsPolicy (user-initiated reboot and redeploy
// settings) is kept as it is.

@description('Names of existing standalone VMs in this resource group.')
param vmNames array = []

@description('Names of existing virtual machine scale sets (Flexible or Uniform) in this resource group.')
param vmssNames array = []

@description('Names of existing availability sets in this resource group.')
param availabilitySetNames array = []

@description('The scheduled events schema version Event Grid delivers (the only one in the preview).')
@allowed([
  '2020-07-01'
])
param scheduledEventsApiVersion string = '2020-07-01'

resource vms 'Microsoft.Compute/virtualMachines@2025-04-01' existing = [for name in vmNames: {
  name: name
}]

resource scaleSets 'Microsoft.Compute/virtualMachineScaleSets@2025-04-01' existing = [for name in vmssNames: {
  name: name
}]

resource availabilitySets 'Microsoft.Compute/availabilitySets@2025-04-01' existing = [for name in availabilitySetNames: {
  name: name
}]

// Read here, written in a nested module: one template cannot declare a resource both as
// existing and as deployed, and the write must carry what it keeps.
module vmWrites 'scheduled-events-policy-target.bicep' = [for (name, i) in vmNames: {
  name: '${take('sebridge-se-policy-vm-${name}', 50)}-${uniqueString(name)}'
  params: {
    kind: 'virtualMachines'
    name: name
    location: vms[i].location
    currentPolicy: vms[i].properties.?scheduledEventsPolicy ?? {}
    scheduledEventsApiVersion: scheduledEventsApiVersion
  }
}]

module vmssWrites 'scheduled-events-policy-target.bicep' = [for (name, i) in vmssNames: {
  name: '${take('sebridge-se-policy-vmss-${name}', 50)}-${uniqueString(name)}'
  params: {
    kind: 'virtualMachineScaleSets'
    name: name
    location: scaleSets[i].location
    currentPolicy: scaleSets[i].properties.?scheduledEventsPolicy ?? {}
    scheduledEventsApiVersion: scheduledEventsApiVersion
  }
}]

module availabilitySetWrites 'scheduled-events-policy-target.bicep' = [for (name, i) in availabilitySetNames: {
  name: '${take('sebridge-se-policy-avset-${name}', 50)}-${uniqueString(name)}'
  params: {
    kind: 'availabilitySets'
    name: name
    location: availabilitySets[i].location
    currentPolicy: availabilitySets[i].properties.?scheduledEventsPolicy ?? {}
    // An availability set's write carries its SKU and domain counts (they cannot change).
    availabilitySetSku: availabilitySets[i].?sku ?? {}
    availabilitySetDomains: {
      platformFaultDomainCount: availabilitySets[i].properties.?platformFaultDomainCount ?? 2
      platformUpdateDomainCount: availabilitySets[i].properties.?platformUpdateDomainCount ?? 5
    }
    scheduledEventsApiVersion: scheduledEventsApiVersion
  }
}]
