// Writes only the scheduledEventsPolicy of one existing VM, scale set or availability set (ARM
// merges the rest of the model, as for the forwarder's identity write in vm-identity.bicep).

@description('Resource type of the target.')
@allowed([
  'virtualMachines'
  'virtualMachineScaleSets'
  'availabilitySets'
])
param kind string

@description('Name of the existing resource (in the deployment\'s resource group).')
param name string

@description('Region of the resource (required by the write).')
param location string

@description('Its scheduledEventsPolicy as it is now (kept, with the Event Grid target added).')
param currentPolicy object = {}

@description('Availability sets only: the set\'s current SKU, carried unchanged.')
param availabilitySetSku object = {}

@description('Availability sets only: the set\'s current fault and update domain counts, carried unchanged.')
param availabilitySetDomains object = {}

@description('The scheduled events schema version Event Grid delivers.')
param scheduledEventsApiVersion string

var policy = union(currentPolicy, {
  scheduledEventsAdditionalPublishingTargets: {
    eventGridAndResourceGraph: {
      enable: true
      scheduledEventsApiVersion: scheduledEventsApiVersion
    }
  }
})

resource vm 'Microsoft.Compute/virtualMachines@2025-04-01' = if (kind == 'virtualMachines') {
  // This write carries only the scheduled events policy; ARM keeps the rest of the model, which
  // belongs to whoever owns the VM. The checks below judge settings this template does not set:
  //checkov:skip=CKV_AZURE_1:OS profile (SSH keys vs passwords) is not set here; it is the existing VM's.
  //checkov:skip=CKV_AZURE_149:OS profile (password authentication) is not set here; it is the existing VM's.
  //checkov:skip=CKV_AZURE_178:OS profile (SSH keys) is not set here; it is the existing VM's.
  //checkov:skip=CKV_AZURE_97:Encryption at host is not set here; it is the existing VM's.
  //checkov:skip=CKV_AZURE_151:Disk encryption is not set here; it is the existing VM's.
  //checkov:skip=CKV_AZURE_50:Whether extensions may run (osProfile.allowExtensionOperations) is not set here; it is the existing VM's.
  name: name
  location: location
  properties: {
    scheduledEventsPolicy: policy
  }
}

resource vmss 'Microsoft.Compute/virtualMachineScaleSets@2025-04-01' = if (kind == 'virtualMachineScaleSets') {
  // Only the scheduled events policy, as for the VM above:
  //checkov:skip=CKV_AZURE_149:OS profile (password authentication) is not set here; it is the existing scale set's.
  //checkov:skip=CKV_AZURE_178:OS profile (SSH keys) is not set here; it is the existing scale set's.
  //checkov:skip=CKV_AZURE_97:Encryption at host is not set here; it is the existing scale set's.
  //checkov:skip=CKV_AZURE_49:OS profile (SSH keys vs passwords) is not set here; it is the existing scale set's.
  name: name
  location: location
  properties: {
    scheduledEventsPolicy: policy
  }
}

resource availabilitySet 'Microsoft.Compute/availabilitySets@2025-04-01' = if (kind == 'availabilitySets') {
  name: name
  location: location
  sku: empty(availabilitySetSku) ? null : availabilitySetSku
  properties: union(availabilitySetDomains, {
    scheduledEventsPolicy: policy
  })
}
